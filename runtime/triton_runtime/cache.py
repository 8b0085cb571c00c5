"""The shared engine cache: a folder per key, published atomically.

A builder works in <cache>/.tmp/<key>.<random>, writes manifest.json last, and renames the folder
to <cache>/<key>: rename is atomic on one filesystem, so a reader sees a whole engine or none.
Builders of the same key serialize on a lock file (flock); one that gets the lock after another
published finds the engine and reuses it. If locks do not reach across nodes (some NFS setups),
the rename still guarantees that the loser's copy is thrown away, never mixed in.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

MANIFEST = "manifest.json"


def engine_dir(cache: Path, key: str) -> Path:
    return cache / key


def lookup(cache: Path, key: str) -> Path | None:
    """The published engine for key, or None. Only complete engines have a manifest."""
    path = engine_dir(cache, key)
    return path if (path / MANIFEST).is_file() else None


@contextlib.contextmanager
def locked(cache: Path, key: str, timeout: float = 6 * 3600) -> Iterator[None]:
    locks = cache / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{key}.lock", "w") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another build of {key} held the lock for {timeout:.0f}s") from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def publish(cache: Path, key: str, build: Callable[[Path], dict], log: Callable[[str], None] = print) -> Path:
    """Return the engine for key, building it with build(tmpdir) -> manifest fields if absent."""
    found = lookup(cache, key)
    if found:
        log(f"engine {key} is in the cache: nothing to build")
        return found
    with locked(cache, key):
        found = lookup(cache, key)
        if found:
            log(f"engine {key} was published by another builder while this one waited: reusing it")
            return found
        scratch = cache / ".tmp" / f"{key}.{uuid.uuid4().hex[:8]}"
        scratch.mkdir(parents=True)
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
            log(f"engine {key} published")
            return target
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
