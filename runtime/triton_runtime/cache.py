"""The shared model cache: a folder per key (a prepared model), published atomically.

A builder works in <cache>/.tmp/<key>.<random>, writes manifest.json last, and renames the folder
to <cache>/<key>: rename is atomic on one filesystem, so a reader sees a whole model or none.
Builders of the same key serialize on a lock file (flock); one that gets the lock after another
published finds the model and reuses it. If locks do not reach across nodes (some NFS setups
answer flock with ENOLCK), the build goes on without one: the rename still guarantees that the
loser's copy is thrown away, never mixed in.

A cache the build cannot write (an NFS export that squashes uid 1000, a claim mounted read-only)
is a CacheError with one line that says what to change, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

MANIFEST = "manifest.json"
#: Seconds between attempts at a lock another builder holds (a preparation takes minutes).
LOCK_POLL_SECONDS = 2.0
LOCKS = ".locks"
SCRATCH = ".tmp"
# flock errors that mean "this filesystem has no (cross-node) locks", not "someone holds it".
NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


class CacheError(RuntimeError):
    """The cache folder cannot be used; the message names the path and what to change."""


def not_writable(cache: Path, path: Path, e: OSError) -> CacheError:
    return CacheError(
        f"model cache {cache} is not writable by uid {os.getuid()} ({e.strerror or e} at {path}): give the "
        f"claim's volume write access for uid/gid {os.getuid()}/{os.getgid()} (fsGroup does not change "
        f"ownership on NFS; set the export's owner or use a StorageClass that honours fsGroup)")


def engine_dir(cache: Path, key: str) -> Path:
    return cache / key


def lookup(cache: Path, key: str) -> Path | None:
    """The published model for key, or None. Only complete ones have a manifest."""
    path = engine_dir(cache, key)
    try:
        return path if (path / MANIFEST).is_file() else None
    except OSError as e:  # a folder this uid may not enter
        raise CacheError(f"model cache {cache} is not readable by uid {os.getuid()} ({e.strerror or e}): give "
                         f"the claim's volume read access for uid/gid {os.getuid()}/{os.getgid()}") from None


def manifest_of(folder: Path) -> dict:
    """A published folder's manifest ({} when it has none readable)."""
    try:
        found = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def manifests(cache: Path) -> list[dict]:
    """Every published manifest (unreadable ones skipped)."""
    paths = sorted(cache.glob(f"*/{MANIFEST}")) if cache.is_dir() else []
    return [found for path in paths if (found := manifest_of(path.parent))]


@contextlib.contextmanager
def locked(cache: Path, key: str, timeout: float = 6 * 3600, log: Callable[[str], None] = print) -> Iterator[None]:
    locks = cache / LOCKS
    path = locks / f"{key}.lock"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        handle = open(path, "w")
    except OSError as e:
        raise not_writable(cache, path, e) from None
    with handle:
        deadline = time.monotonic() + timeout
        held, waiting = True, False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:  # once: the job's log then says why it is idle
                    log(f"another builder holds the lock of {key}: waiting for it")
                    waiting = True
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another build of {key} held the lock for {timeout:.0f}s") from None
                time.sleep(LOCK_POLL_SECONDS)
            except OSError as e:
                if e.errno not in NO_LOCKS:
                    raise
                log(f"the model cache's filesystem has no file locks ({e.strerror}): building without one")
                held = False
                break
        try:
            yield
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


def publish(cache: Path, key: str, build: Callable[[Path], dict], log: Callable[[str], None] = print) -> Path:
    """Return the folder for key, building it with build(tmpdir) -> manifest fields if absent."""
    found = lookup(cache, key)
    if found:
        log(f"{key} is in the cache: nothing to build")
        return found
    with locked(cache, key, log=log):
        found = lookup(cache, key)
        if found:
            log(f"{key} was published by another preparation while this one waited: reusing it")
            return found
        scratch = cache / SCRATCH / f"{key}.{uuid.uuid4().hex[:8]}"
        try:
            scratch.mkdir(parents=True)
        except OSError as e:
            raise not_writable(cache, scratch, e) from None
        try:
            fields = build(scratch)
            (scratch / MANIFEST).write_text(json.dumps({"key": key, **fields}, indent=2, sort_keys=True))
            target = engine_dir(cache, key)
            try:
                os.rename(scratch, target)
            except OSError:
                if lookup(cache, key):  # lost a race with a builder that had no lock: theirs stands
                    return engine_dir(cache, key)
                raise
            log(f"{key} published")
            return target
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
