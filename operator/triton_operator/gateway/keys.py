"""API keys (pure): parse key lists, check a presented key, decide what it may use, rate-limit it.

A key list is YAML (or JSON), as mounted from a Secret:

    keys:
      - name: team-a                 # shown in metrics and logs; the key itself never is
        key: sk-team-a-...           # or sha256: <hex digest of the key>, to keep no plain key at rest
        namespaces: [ml]             # every InferenceService in these namespaces ("*": all)
        services: [vision/resnet50]  # and these, as NAMESPACE/NAME
        requestsPerMinute: 600       # rate limit (default: the gateway's --requests-per-minute)

Only SHA-256 digests are kept in memory: the plain key is hashed as the file is read and
dropped, and a presented key is hashed and looked up, so neither the file's keys nor a caller's
guess can appear in a log line, a traceback or a metric label.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import yaml

Key = tuple[str, str]  # (namespace, InferenceService name)


class KeyFileError(ValueError):
    """A key list that cannot be used; the message names the file and entry, never a key."""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    """What one API key may use."""

    name: str
    namespaces: frozenset[str] = frozenset()
    services: frozenset[Key] = frozenset()
    requests_per_minute: float | None = None

    def allows(self, key: Key) -> bool:
        return "*" in self.namespaces or key[0] in self.namespaces or key in self.services

    def may_hold_name(self, name: str) -> bool:
        """Whether some service called `name` would be within this grant, wherever it lives. A
        lookup by bare name that finds nothing answers 404 only then (the key may see every place
        such a service could be); otherwise 403, which says nothing about what exists."""
        return bool(self.namespaces) or any(n == name for _, n in self.services)


def parse(text: str, source: str) -> dict[str, Grant]:
    """A key list -> {sha256 digest: grant}."""
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError:
        raise KeyFileError(f"{source}: not valid YAML or JSON") from None
    entries = doc.get("keys") if isinstance(doc, dict) else doc
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise KeyFileError(f"{source}: expected a list under 'keys'")
    out: dict[str, Grant] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: keys[{i}]"
        if not isinstance(entry, dict):
            raise KeyFileError(f"{where}: expected a mapping")
        unknown = set(entry) - {"name", "key", "sha256", "namespaces", "services", "requestsPerMinute"}
        if unknown:
            raise KeyFileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        name = str(entry.get("name") or f"key-{i}")
        where = f"{source}: key {name}"
        plain, hashed = entry.get("key"), entry.get("sha256")
        if bool(plain) == bool(hashed):
            raise KeyFileError(f"{where}: set exactly one of key or sha256")
        if plain is not None and (not isinstance(plain, str) or len(plain) < 16):
            raise KeyFileError(f"{where}: a key must be a string of at least 16 characters")
        if hashed is not None and (not isinstance(hashed, str) or len(hashed) != 64
                                   or any(ch not in "0123456789abcdef" for ch in hashed.lower())):
            raise KeyFileError(f"{where}: sha256 must be 64 hexadecimal digits")
        namespaces = _strings(entry.get("namespaces"), f"{where}: namespaces")
        services: set[Key] = set()
        for s in _strings(entry.get("services"), f"{where}: services"):
            ns, sep, svc = s.partition("/")
            if not sep or not ns or not svc:
                raise KeyFileError(f"{where}: services entries are NAMESPACE/NAME, found {s!r}")
            services.add((ns, svc))
        if not namespaces and not services:
            raise KeyFileError(f"{where}: grants nothing (set namespaces or services)")
        rpm = entry.get("requestsPerMinute")
        if rpm is not None and (isinstance(rpm, bool) or not isinstance(rpm, (int, float)) or rpm <= 0):
            raise KeyFileError(f"{where}: requestsPerMinute must be a positive number")
        key_digest = hashed.lower() if hashed else digest(plain)
        if key_digest in out:
            raise KeyFileError(f"{where}: the same key is listed twice")
        out[key_digest] = Grant(name, frozenset(namespaces), frozenset(services), rpm)
    return out


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise KeyFileError(f"{where} must be a list of strings")
    return value


def merge(lists: Iterable[tuple[str, dict[str, Grant]]]) -> dict[str, Grant]:
    """Several key lists in one; a key in two lists is refused (which grant would win?)."""
    out: dict[str, Grant] = {}
    for source, grants in lists:
        for d, grant in grants.items():
            if d in out:
                raise KeyFileError(f"{source}: key {grant.name} is also listed as {out[d].name}")
            out[d] = grant
    return out


def bearer(header: str | None) -> str | None:
    """The key in an `Authorization: Bearer KEY` header."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def to_json(grants: dict[str, Grant]) -> str:
    """A key list holding digests only (for `triton-operator gateway hash-keys`)."""
    return json.dumps({"keys": [{
        "name": g.name, "sha256": d, "namespaces": sorted(g.namespaces),
        "services": sorted(f"{ns}/{n}" for ns, n in g.services),
        **({"requestsPerMinute": g.requests_per_minute} if g.requests_per_minute else {}),
    } for d, g in grants.items()]}, indent=2)


@dataclass
class RateLimiter:
    """A token bucket per key: `per_minute` requests a minute, bursts of up to a tenth of that
    (at least 5). The clock is passed in."""

    default_per_minute: float
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # digest -> (tokens, stamp)

    def take(self, key_digest: str, grant: Grant, now: float) -> float:
        """0 when the request may go; else the seconds until it may (the Retry-After)."""
        per_minute = grant.requests_per_minute or self.default_per_minute
        if per_minute <= 0 or math.isinf(per_minute):
            return 0.0
        rate = per_minute / 60.0
        burst = max(5.0, per_minute / 10.0)
        tokens, stamp = self.buckets.get(key_digest, (burst, now))
        tokens = min(burst, tokens + (now - stamp) * rate)
        if tokens >= 1.0:
            self.buckets[key_digest] = (tokens - 1.0, now)
            return 0.0
        self.buckets[key_digest] = (tokens, now)
        return (1.0 - tokens) / rate

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the buckets of keys no longer listed."""
        kept = set(keep)
        self.buckets = {k: v for k, v in self.buckets.items() if k in kept}
