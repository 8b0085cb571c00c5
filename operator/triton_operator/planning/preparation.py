"""A tensorrt-llm service's model preparation (pure): the rendered preparation Job + the observed
Jobs + what status already knew -> Preparing / Ready / Failed, with the Job's own reason when it
failed.

Once the model is Ready its Job may be deleted or garbage-collected: status remembers the Job
that prepared it, so serving never waits on a finished preparation again. One preparation serves
every GPU class (the checkpoint does not depend on the GPU): when it is Ready, every class may
serve."""

from __future__ import annotations

import re
from typing import Any, Collection, Iterator

from ..labels import LABEL_GPU_CLASS


def _condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def _terminations(job_name: str, pods: list[dict[str, Any]],
                  last_too: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """(container name, terminated state) of every container of the Job's pods that ended, from
    its current state (and its last one, with `last_too`)."""
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if job_name not in (labels.get("batch.kubernetes.io/job-name"), labels.get("job-name")):
            continue
        st = pod.get("status") or {}
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            for state in (cs.get("state") or {}, cs.get("lastState") or {}) if last_too else (cs.get("state") or {},):
                term = state.get("terminated")
                if term:
                    yield cs.get("name") or "", term


def _said(job_name: str, pods: list[dict[str, Any]]) -> str | None:
    """What a failed container of the Job's pods said on its way out (runtime/'s doctor writes
    its findings to the termination log), if anything."""
    for name, term in _terminations(job_name, pods, last_too=True):
        if term.get("exitCode") not in (None, 0) and (term.get("message") or "").strip():
            return f"{name}: {term['message'].strip()}"
    return None


_COMMIT = re.compile(r"\bat commit ([0-9a-f]{40})\b")


def _commit(job_name: str, pods: list[dict[str, Any]]) -> str | None:
    """The commit a finished preparation fetched (runtime/'s prepare writes "... at commit <sha>"
    to its termination log), if its pod is still there to say it."""
    for _, term in _terminations(job_name, pods, last_too=False):
        if term.get("exitCode") == 0 and (m := _COMMIT.search(term.get("message") or "")):
            return m.group(1)
    return None


def states(rendered: list[dict[str, Any]], observed: list[dict[str, Any]], known: list[dict[str, Any]] | None,
           precision: str, pods: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    by_name = {j["metadata"]["name"]: j for j in observed}
    ready_before = {e["job"]: e for e in known or [] if e.get("phase") == "Ready"}
    out = []
    for job in rendered:
        name = job["metadata"]["name"]
        gpu_class = (job["metadata"].get("labels") or {}).get(LABEL_GPU_CLASS)
        live = by_name.get(name)
        commit = None
        if name in ready_before or (live and _condition(live, "Complete")):
            commit = (ready_before.get(name) or {}).get("commit") or _commit(name, pods or [])
            phase, message = "Ready", f"model prepared ({precision}) and cached" + (
                f", from commit {commit}" if commit else "")
        elif live and (failed := _condition(live, "Failed")):
            phase = "Failed"
            why = _said(name, pods or []) or failed.get("message") or ""
            message = f"preparation Job {name} failed: {failed.get('reason') or 'Failed'}: {why}".rstrip(": ")
        else:
            active = int(((live or {}).get("status") or {}).get("active") or 0)
            phase = "Preparing"
            where = f"a {gpu_class} node to quantize on" if gpu_class else "a node"
            message = f"preparation Job {name} is running" if active else f"preparation Job {name} is waiting for {where}"
        out.append({"precision": precision, **({"gpuClass": gpu_class} if gpu_class else {}), "phase": phase,
                    "job": name, **({"commit": commit} if commit else {}), "message": message})
    return out


def ready_classes(prep_states: list[dict[str, Any]], usable: Collection[str]) -> set[str]:
    """The GPU classes that may serve: all of them once the model is prepared, none before."""
    return set(usable) if prep_states and all(e["phase"] == "Ready" for e in prep_states) else set()
