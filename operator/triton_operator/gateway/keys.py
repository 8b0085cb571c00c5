"""API keys (pure): parse key lists, check a presented key, decide what it may use, rate-limit it.

A key list is YAML (or JSON), as mounted from a Secret:

    keys:
      - name: team-a                 # shown in metrics and logs; the key itself never is
        key: sk-team-a-...           # or sha256: <hex digest of the key>, to keep no plain key at rest
        namespaces: [ml]             # every InferenceService in these namespaces ("*": all)
        services: [vision/resnet50]  # and these, as NAMESPACE/NAME
        requestsPerMinute: 600       # rate limit (default: the gateway's --requests-per-minute)
        tokensPerMinute: 200000      # prompt + generated tokens a minute (default: no limit)
        maxInFlight: 64              # requests open at once (default: the gateway's maxInFlightPerKey)
        maxTokens: 8192              # largest max_tokens a request may ask (default: maxTokensPerRequest)

A plain key must be strong: 32 characters or more, about 128 bits by the characters it uses, and
not a run or a repetition (generate one with `openssl rand -hex 32`, or
`python3 -c 'import secrets; print("sk-" + secrets.token_urlsafe(32))'`). A sha256 entry cannot be
checked: hash a key that passed (`triton-operator gateway --key-file F --check-keys`).

Only SHA-256 digests are kept in memory: the plain key is hashed as the file is read and
dropped, and a presented key is hashed and looked up, so neither the file's keys nor a caller's
guess can appear in a log line, a traceback or a metric label.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import yaml

from .routing import ServiceKey


class KeyFileError(ValueError):
    """A key list that cannot be used; the message names the file and entry, never a key."""


def digest(secret: str) -> str:
    """A key's SHA-256. A header value that is not UTF-8 (aiohttp keeps its bytes as surrogate
    escapes) has one too, which no key's matches: it is a wrong key, not an error."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Grant:
    """What one API key may use."""

    name: str
    namespaces: frozenset[str] = frozenset()
    services: frozenset[ServiceKey] = frozenset()
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_in_flight: int | None = None
    max_tokens: int | None = None

    def allows(self, service: ServiceKey) -> bool:
        return "*" in self.namespaces or service[0] in self.namespaces or service in self.services

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
        unknown = set(entry) - {"name", "key", "sha256", "namespaces", "services", "requestsPerMinute",
                                "tokensPerMinute", "maxInFlight", "maxTokens"}
        if unknown:
            raise KeyFileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        named = entry.get("name")
        where = f"{source}: key {named}" if named else where
        plain, hashed = entry.get("key"), entry.get("sha256")
        if bool(plain) == bool(hashed):
            raise KeyFileError(f"{where}: set exactly one of key or sha256")
        if plain is not None:
            weak = weakness(plain) if isinstance(plain, str) else "it is not a string"
            if weak:
                raise KeyFileError(f"{where}: the key is too weak ({weak}); generate one with "
                                   f"'openssl rand -hex 32'")
        if hashed is not None and (not isinstance(hashed, str) or len(hashed) != 64
                                   or any(ch not in "0123456789abcdef" for ch in hashed.lower())):
            raise KeyFileError(f"{where}: sha256 must be 64 hexadecimal digits")
        namespaces = _strings(entry.get("namespaces"), f"{where}: namespaces")
        services: set[ServiceKey] = set()
        for s in _strings(entry.get("services"), f"{where}: services"):
            ns, sep, svc = s.partition("/")
            if not sep or not ns or not svc:
                raise KeyFileError(f"{where}: services entries are NAMESPACE/NAME, found {s!r}")
            services.add((ns, svc))
        if not namespaces and not services:
            raise KeyFileError(f"{where}: grants nothing (set namespaces or services)")
        rpm = _positive(entry, "requestsPerMinute", where)
        tpm = _positive(entry, "tokensPerMinute", where)
        in_flight = _positive(entry, "maxInFlight", where, integer=True)
        max_tokens = _positive(entry, "maxTokens", where, integer=True)
        key_digest = hashed.lower() if hashed else digest(plain)
        # The name is the tenant: its usage, its limits' messages and its prompt-cache scope. A key
        # without one gets a name of its own (from its digest, which is no secret): numbered per
        # file, the first unnamed key of every file was "key-0", and the tenants of two files
        # shared one prompt-cache scope and one line of usage.
        name = str(named) if named else f"key-{key_digest[:12]}"
        if key_digest in out:
            raise KeyFileError(f"{where}: the same key is listed twice")
        out[key_digest] = Grant(name, frozenset(namespaces), frozenset(services), rpm, tpm,
                                in_flight, max_tokens)  # type: ignore[arg-type]
    return out


def _positive(entry: dict[str, Any], field_name: str, where: str, integer: bool = False) -> float | int | None:
    value = entry.get(field_name)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    # NaN compares false with everything (a `.nan` limit let every request through, as none);
    # `.inf` is no limit either (leave the field out for that), nor an integer past a float's range.
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(_as_float(value)) or value <= 0:
        raise KeyFileError(f"{where}: {field_name} must be a positive {'integer' if integer else 'finite number'}")
    return value


def _as_float(value: float | int) -> float:
    """`value` as the float the limiters compute with; inf for an integer past a float's range (a
    401-digit requestsPerMinute overflowed on every request)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


MIN_KEY_LENGTH = 32
MIN_KEY_BITS = 128
_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits)


def weakness(key: str) -> str | None:
    """Why `key` is too weak to guard a GPU fleet, or None. Bits are estimated from the length and
    the classes of characters used (a 64-digit hex key: 256); a key made of runs ("abcdef...",
    "0123...") or of few distinct characters is refused whatever its length."""
    if len(key) < MIN_KEY_LENGTH:
        return f"{len(key)} characters, at least {MIN_KEY_LENGTH} needed"
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        return "it holds spaces or control characters"
    alphabet = sum(len(c) for c in _CLASSES if any(ch in c for ch in key))
    alphabet += 32 if any(not ch.isalnum() for ch in key) else 0
    bits = len(key) * math.log2(max(alphabet, 2))
    if bits < MIN_KEY_BITS:
        return f"about {bits:.0f} bits, at least {MIN_KEY_BITS} needed"
    counts = Counter(key)
    distinct = len(counts)
    if distinct < 12 or max(counts.values()) > len(key) / 4:
        return "too few distinct characters"
    steps = [ord(b) - ord(a) for a, b in zip(key, key[1:])]
    run = longest = 0
    for i, step in enumerate(steps):
        run = run + 1 if i and step == steps[i - 1] and abs(step) <= 1 else 0
        longest = max(longest, run)
    if longest >= 4:
        return "it holds a run of repeated or consecutive characters"
    return None


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
    """A key list holding digests only (for `triton-operator gateway --check-keys`)."""
    return json.dumps({"keys": [{
        "name": g.name, "sha256": d, "namespaces": sorted(g.namespaces),
        "services": sorted(f"{ns}/{n}" for ns, n in g.services),
        **{name: value for name, value in (("requestsPerMinute", g.requests_per_minute),
                                           ("tokensPerMinute", g.tokens_per_minute),
                                           ("maxInFlight", g.max_in_flight), ("maxTokens", g.max_tokens))
           if value is not None},
    } for d, g in grants.items()]}, indent=2)


@dataclass
class RateLimiter:
    """A token bucket per key: `per_minute` requests a minute (split over `replicas` gateways,
    each enforcing its part), bursts of up to a tenth of that (at least 5). The clock is passed in."""

    default_per_minute: float
    replicas: int = 1
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # digest -> (tokens, stamp)

    def take(self, key_digest: str, grant: Grant, now: float) -> float:
        """0 when the request may go; else the seconds until it may (the Retry-After)."""
        per_minute = (grant.requests_per_minute or self.default_per_minute) / self.replicas
        if per_minute <= 0 or math.isinf(per_minute):
            return 0.0
        return _take(self.buckets, key_digest, per_minute, max(5.0, per_minute / 10.0), 1.0, now)

    def charge(self, key_digest: str, grant: Grant, cost: float, now: float) -> float:
        """Take `cost` more requests' worth for a request `take` let in (at most what a full bucket
        holds past that request, so that any request can pass): 0 when taken; else the request is
        refused, the one `take` took stays taken (a client that sends it again at once is refused
        by `take`, before its body is read), and the seconds until the bucket holds the whole
        request, that one included, are returned: a client that waits them and sends it again gets
        in (counted without it, each retry arrived one short, every time)."""
        per_minute = (grant.requests_per_minute or self.default_per_minute) / self.replicas
        if cost <= 0 or per_minute <= 0 or math.isinf(per_minute):
            return 0.0
        burst = max(5.0, per_minute / 10.0)
        cost = min(cost, burst - 1.0)
        if _take(self.buckets, key_digest, per_minute, burst, cost, now) == 0.0:
            return 0.0
        return (cost + 1.0 - self.buckets[key_digest][0]) / (per_minute / 60.0)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the buckets of keys no longer listed."""
        kept = set(keep)
        self.buckets = {k: v for k, v in self.buckets.items() if k in kept}


def _take(buckets: dict[str, tuple[float, float]], name: str, per_minute: float, burst: float, cost: float,
          now: float) -> float:
    rate = per_minute / 60.0
    tokens, stamp = buckets.get(name, (burst, now))
    tokens = min(burst, tokens + (now - stamp) * rate)
    if tokens >= cost:
        buckets[name] = (tokens - cost, now)
        return 0.0
    buckets[name] = (tokens, now)
    return (cost - tokens) / rate


@dataclass
class TokenLimiter:
    """Tokens a minute per key (prompt and generated), split over `replicas` gateways. A request
    may start while its key's bucket is above zero; what it used is taken when it ends, so the
    bucket can go below zero and then holds the key's next requests until it refills."""

    replicas: int = 1
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def _level(self, key_digest: str, per_minute: float, now: float) -> float:
        tokens, stamp = self.buckets.get(key_digest, (per_minute, now))
        return min(per_minute, tokens + (now - stamp) * per_minute / 60.0)

    def wait(self, key_digest: str, grant: Grant, now: float) -> float:
        """0 when the key may start a request; else the seconds until its bucket is above zero."""
        if not grant.tokens_per_minute:
            return 0.0
        per_minute = grant.tokens_per_minute / self.replicas
        level = self._level(key_digest, per_minute, now)
        return 0.0 if level > 0 else (1.0 - level) / (per_minute / 60.0)

    def spend(self, key_digest: str, grant: Grant, tokens: int, now: float) -> None:
        if not grant.tokens_per_minute:
            return
        per_minute = grant.tokens_per_minute / self.replicas
        self.buckets[key_digest] = (self._level(key_digest, per_minute, now) - tokens, now)

    def forget(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        self.buckets = {k: v for k, v in self.buckets.items() if k in kept}


@dataclass
class FailureLimiter:
    """Failed key attempts per client address: `per_minute`, bursts of a third of it. Past it the
    address's failed attempts get 429 instead of 401 (an alert and a log line's worth of signal;
    it does not slow a guesser, whose right guess is still answered: keys must be long random
    secrets, which the key file's checks ask for); a valid key is looked at first and never
    refused by this, so an attacker behind a shared proxy address cannot lock out the keys of
    others behind it. At most
    `capacity` addresses are tracked (the oldest are forgotten first: a full bucket is the same as
    none)."""

    per_minute: float
    capacity: int = 100_000
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def burst(self) -> float:
        return max(3.0, self.per_minute / 3.0)

    def blocked(self, address: str, now: float) -> float:
        """Seconds until `address` may try a key again (0: it may now)."""
        tokens, stamp = self.buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - stamp) * self.per_minute / 60.0)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / (self.per_minute / 60.0)

    def failed(self, address: str, now: float) -> None:
        if address not in self.buckets and len(self.buckets) >= self.capacity:
            for old in list(self.buckets)[: max(1, self.capacity // 10)]:
                del self.buckets[old]
        _take(self.buckets, address, self.per_minute, self.burst, 1.0, now)


def client_address(peer: str | None, forwarded_for: str | None,
                   trusted: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> str:
    """The client's address: the peer's, unless the peer is a trusted proxy; then the last
    X-Forwarded-For entry that is not one (entries before it could be made up by the client)."""
    address = peer or "unknown"
    if not trusted or not _within(address, trusted):
        return address
    for hop in reversed([h.strip() for h in (forwarded_for or "").split(",") if h.strip()]):
        if not _within(hop, trusted):
            return hop
        address = hop
    return address


def _within(address: str, networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in n for n in networks)
