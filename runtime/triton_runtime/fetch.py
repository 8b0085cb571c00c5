"""Fetch a model (or a calibration dataset) from hf://, s3://, gs:// or pvc:// into a local folder.

Credentials come only from the environment, which the operator fills from the Secret named in
spec.model.credentialsSecret (HF_TOKEN; AWS_*; GOOGLE_APPLICATION_CREDENTIALS). Cloud clients are
imported only for the scheme in use, with a clear message when one is missing.

A checkpoint is fetched selectively (`checkpoint_files`): Hugging Face repositories often carry
the same weights twice, e.g. Meta's Llama repositories hold `original/*.pth` beside the
safetensors (about 16 GB more for 8B, 140 GB for 70B), and older ones hold PyTorch, TensorFlow,
Flax and ONNX copies. TensorRT-LLM's converters read only the transformers layout at the top.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Callable, Iterable

# The operator mounts pvc://CLAIM/... read-only at <PVC_ROOT>/CLAIM.
PVC_ROOT = Path(os.environ.get("TRITON_RUNTIME_PVC_ROOT", "/mnt/pvc"))

# What a transformers checkpoint needs beside its weights: config.json, generation_config.json,
# the weight index, tokenizer.json / tokenizer_config.json / special_tokens_map.json, and the
# tokenizer's own files (sentencepiece tokenizer.model, tiktoken, vocab/merges).
CHECKPOINT_SIDE_FILES = (".json", ".model", ".tiktoken", ".txt")

Selector = Callable[[Iterable[str]], list[str]]


class FetchError(RuntimeError):
    """The source cannot be used as given: the message names it and what to change."""


class SourceUnavailable(FetchError):
    """The source could not be reached (network, server error): worth retrying."""


class MissingLibrary(FetchError):
    """This image lacks the client library of the source's scheme (NVIDIA's image has
    huggingface_hub but neither boto3 nor google-cloud-storage; the operator's image has all)."""


def _http_status(e: Exception) -> int | None:
    """The HTTP status behind a client error: requests/huggingface_hub, botocore, google-api-core."""
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    if code is None and isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code is None:
        code = getattr(e, "code", None)
    return code if isinstance(code, int) else None


def _explain(source: str, e: Exception) -> FetchError:
    """One line for a client library's exception, definite (bad name, no access) or transient."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    status = _http_status(e)
    if status in (401, 403):
        return FetchError(f"{source}: access refused ({status}: {first}); put a token with access in the "
                          f"Secret named by spec.model.credentialsSecret (HF_TOKEN, AWS_*, GOOGLE_*)")
    if status == 404:
        return FetchError(f"{source}: not found ({first}); check the name and revision")
    return SourceUnavailable(f"{source}: {type(e).__name__}: {first}")


def split(source: str) -> tuple[str, str, str]:
    """(scheme, first part, rest): hf://org/name, s3://bucket/prefix, pvc://claim/path."""
    scheme, sep, rest = source.partition("://")
    if not sep or scheme not in ("hf", "s3", "gs", "pvc"):
        raise FetchError(f"unsupported model source {source!r}: use hf://, s3://, gs:// or pvc://")
    head, _, tail = rest.partition("/")
    return scheme, head, tail


def local_path(source: str) -> Path | None:
    """pvc:// sources are already on disk: no copy."""
    scheme, claim, path = split(source)
    if scheme != "pvc":
        return None
    where = PVC_ROOT / claim / path
    if not where.exists():
        raise FetchError(f"{source}: {where} does not exist in the mounted claim {claim}")
    return where


def checkpoint_files(files: Iterable[str]) -> list[str]:
    """The files of a Hugging Face checkpoint that conversion needs (pure): the top-level
    safetensors (else the PyTorch .bin files) and the config and tokenizer files; never
    subfolders such as original/ or onnx/, never a second copy of the weights."""
    top = sorted(f for f in files if "/" not in f)
    weights = [f for f in top if f.endswith(".safetensors")] or [f for f in top if f.endswith(".bin")]
    if not weights:
        raise FetchError("no *.safetensors or *.bin weights at the top of the checkpoint: TensorRT-LLM "
                         "converts Hugging Face transformers checkpoints")
    return sorted({*weights, *(f for f in top if f.endswith(CHECKPOINT_SIDE_FILES))})


def _hf_api():
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise MissingLibrary("hf:// needs the huggingface_hub package in this image") from None
    return HfApi(token=os.environ.get("HF_TOKEN") or None)


def listing(source: str, revision: str | None = None, repo_type: str = "model") -> dict[str, int]:
    """Every file of a remote source, relative path -> size in bytes, without downloading it.
    pvc:// sources are listed from the mounted claim."""
    try:
        return _listing(source, revision, repo_type)
    except FetchError:
        raise
    except Exception as e:  # the clients' own errors, as one line
        raise _explain(source, e) from None


def _listing(source: str, revision: str | None, repo_type: str) -> dict[str, int]:
    on_disk = local_path(source)
    if on_disk is not None:
        if on_disk.is_file():
            return {on_disk.name: on_disk.stat().st_size}
        return {str(p.relative_to(on_disk)): p.stat().st_size for p in on_disk.rglob("*") if p.is_file()}
    scheme, head, tail = split(source)
    if scheme == "hf":
        info = _hf_api().repo_info(f"{head}/{tail}", revision=revision or "main", repo_type=repo_type,
                                   files_metadata=True)
        return {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    if scheme == "s3":
        bucket = _s3_bucket(head)
        return {os.path.relpath(o.key, tail or "."): int(o.size) for o in bucket.objects.filter(Prefix=tail)
                if not o.key.endswith("/")}
    return {os.path.relpath(b.name, tail or "."): int(b.size or 0) for b in _gcs_blobs(head, tail)}


def _s3_bucket(name: str):
    try:
        import boto3
    except ImportError:
        raise MissingLibrary("s3:// needs the boto3 package in this image") from None
    return boto3.resource("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None).Bucket(name)


def _gcs_blobs(bucket: str, prefix: str) -> list:
    try:
        from google.cloud import storage
    except ImportError:
        raise MissingLibrary("gs:// needs the google-cloud-storage package in this image") from None
    return [b for b in storage.Client().list_blobs(bucket, prefix=prefix) if not b.name.endswith("/")]


COMMIT = re.compile(r"[0-9a-f]{40}")   # a Hugging Face commit id: what a revision resolves to


def resolve(source: str, revision: str | None = None, repo_type: str = "model") -> str | None:
    """The commit an hf:// source's revision (a branch, a tag or a commit; "main" by default)
    points at now, so that everything fetched for one preparation comes from that one commit
    even if the branch moves meanwhile; None for sources without commits (s3://, gs://, pvc://)."""
    if local_path(source) is not None or split(source)[0] != "hf":
        return None
    if revision and COMMIT.fullmatch(revision):
        return revision
    try:
        _, head, tail = split(source)
        return str(_hf_api().repo_info(f"{head}/{tail}", revision=revision or "main", repo_type=repo_type).sha)
    except FetchError:
        raise
    except Exception as e:  # the clients' own errors, as one line
        raise _explain(source, e) from None


def fetch(source: str, dest: Path, revision: str | None = None, select: Selector | None = None,
          repo_type: str = "model") -> Path:
    """The source's files on local disk (dest, or the pvc mount itself). `select` picks the files
    to download from the source's listing (all when None); pvc:// sources are used in place."""
    try:
        return _fetch(source, dest, revision, select, repo_type)
    except FetchError:
        raise
    except Exception as e:  # the clients' own errors, as one line
        raise _explain(source, e) from None


def _fetch(source: str, dest: Path, revision: str | None, select: Selector | None, repo_type: str) -> Path:
    on_disk = local_path(source)
    if on_disk is not None:
        return on_disk
    scheme, head, tail = split(source)
    dest.mkdir(parents=True, exist_ok=True)
    if scheme == "hf":
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise MissingLibrary("hf:// needs the huggingface_hub package in this image") from None
        wanted = None
        if select is not None:
            # Exact names, escaped so that fnmatch (which snapshot_download applies) matches only them.
            wanted = [glob.escape(f) for f in select(listing(source, revision, repo_type))]
        snapshot_download(repo_id=f"{head}/{tail}", revision=revision or "main", local_dir=str(dest),
                          repo_type=repo_type, token=os.environ.get("HF_TOKEN") or None, allow_patterns=wanted)
        return dest
    if scheme == "s3":
        bucket = _s3_bucket(head)
        objects = {os.path.relpath(o.key, tail or "."): o.key for o in bucket.objects.filter(Prefix=tail)
                   if not o.key.endswith("/")}
        if not objects:
            raise FetchError(f"{source}: no objects under that prefix")
        for rel in (select(objects) if select else objects):
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            bucket.download_file(objects[rel], str(target))
        return dest
    blobs = {os.path.relpath(b.name, tail or "."): b for b in _gcs_blobs(head, tail)}
    if not blobs:
        raise FetchError(f"{source}: no objects under that prefix")
    for rel in (select(blobs) if select else blobs):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        blobs[rel].download_to_filename(str(target))
    return dest
