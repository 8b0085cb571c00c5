"""Which InferenceServices exist, where their ready replicas are, and which replica a request
goes to (pure; fed by `watches`, used from one event loop).

A replica is an endpoint of the service's EndpointSlices (the Service the operator renders has
the InferenceService's name; its port `http` is Triton's HTTP port) whose `ready` condition is
not false. With `spec.routing.policy: leastInFlight` a request goes to the ready endpoint with the
fewest requests in flight from this gateway; ties go round robin, so an idle fleet still spreads its
load. A service that leaves the policy unset gets kvEvents (below) when it generates on the
operator's own LLM model, whose engine reports what its cache holds, and leastInFlight otherwise:
measured on real replicas (`make bench-routing`, bench/results/routing.md), kvEvents served 1.6-3.1x
leastInFlight's requests/s with shared system prompts, 0.95-1.4x on multi-turn chat (runs move that
much; 5.0-5.5x at a steady state: bench/results/routing-conversations.md), and 0.97-1.04x where
prompts share nothing.

With `spec.routing.policy: prefix`, a request goes where its first token comes soonest, as this
gateway can tell (cache-aware routing, as llm-d's prefix and queue scorers and Dynamo's KV router):
- what each replica holds: an index of the beginnings this gateway sent it, as hashes of each
  whole BLOCK_CHARS block of the prompt chained from its start (a block's hash names everything
  before it, as the engines' KV block hashes do), least recently sent forgotten first past
  INDEX_BLOCKS, and a replica's whole index forgotten when it leaves the ready endpoints or fails
  to connect (a restarted replica's cache is empty);
- the cost of a replica, in characters of prompt to read: the part of this prompt it does not
  hold, plus its answer (DECODE_CHARS a token), plus, when its batch (spec.engine.maxBatchSize)
  is full, what is left of the work ahead of it (half of what runs, all of what waits);
- the cheapest replica whose requests in flight are under AFFINITY_LOAD times the mean, plus one
  where at most one request would then wait for its batch (consistent hashing with bounded loads, as
  KubeAI's PrefixHash: a hot beginning cannot pile onto one replica; chats under one product's
  system prompt, 3 in flight on 3 replicas of one sequence, all went to the replica that read it
  first, at half leastInFlight's requests/s), or whose share of about the last SHARE_PICKS requests
  routed is under AFFINITY_LOAD / n, whatever it has in flight (a tenant's third request then waits
  behind two short ones instead of reading its prompt cold elsewhere:
  bench/results/routing-steady.md); any replica when every one is past that; among equals, the
  first in an order the request's first AFFINITY_CHARS characters alone decide (rendezvous hashing
  of that affinity and the address). A beginning no replica holds yet goes to the first in its
  order, so every gateway replica sends it to the same place without sharing state, and replicas
  coming or going move only the beginnings they rank first.

With `spec.routing.policy: kvEvents` the same choice is made on what each replica's engine says it
holds, not on what this gateway sent it: each request carries its block hashes (`prefix_keys`) and
how many lie before its last message, the engine names the states it saves and evicts by them, and
each answer brings back the engine's events since this gateway's cursor on that replica
(runtime/triton_runtime/serving/kv_events.py). A replica then holds a request's first n blocks
when its engine last said it stored a prefix named by the request's n-th block hash, or, as with
prefix, when this gateway sent it them, unless its engine has since said it evicted them. Every
gateway replica reads the same events, so each knows what the others' requests left on a
replica, and none counts on a prompt a replica evicted; an engine that restarts starts a new run,
whose first answer replaces what was known of it (what was sent there included).
Each answer also says how many requests its engine held then: less this gateway's own, what the
other gateway replicas sent it, counted with this gateway's requests in flight there for
OTHERS_FOR_S seconds (the load bound and the work ahead then see every gateway's requests, not
one's share of them). A prompt that no replica is known to hold up to its last message (a chat's
next turn whose last turn went through another gateway replica, whose answer told that one what
it left) is routed only after the replicas not heard from within PROBE_FRESH_S are asked for their
events (to_probe; upstream.Upstream.probe): behind two gateways that alternate a conversation's
turns, the hit rate went from 0.78-0.86x of one gateway's to 0.91-0.99x. Engines also tell the
prompts they are reading (requests taken in and not finished, up to their last message), held
there for OTHERS_FOR_S or until the engine next tells: two gateways that each send a tenant's
first requests before either is answered then agree on one replica.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..api.spec import raw_service_level
from ..kube.store import Key
from .passthrough import is_model_name

log = logging.getLogger(__name__)

ServiceKey = Key   # (namespace, InferenceService name): a service, never an API key
Address = tuple[str, int]

# The model LLM services (format tensorrt-llm) serve: runtime/triton_runtime/serving/contract.py.
LLM_MODEL = "llm"
DEFAULT_MAX_TOKENS = 256
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# The leading characters of a request that choose its replica (prefix routing): few enough to stay
# the same over a conversation's turns (each resends a longer history) and to be a tenant's shared
# system prompt (the first characters of thousands), as KubeAI's PrefixHash hashes its first 100.
AFFINITY_CHARS = 256
AFFINITY_LOAD = 1.25       # a replica takes a request while it has under this times the mean in flight, plus one
SHARE_PICKS = 32           # ... or while its share of about the last this many requests routed is under that times 1/n
DEFAULT_MAX_BATCH = 64     # spec.engine.maxBatchSize's default (api/serving.py)
# The index of what a replica holds: blocks of 64 characters (about 16 tokens, an engine's KV block
# size: TensorRT-LLM's tokens_per_block defaults to 32, vLLM's block to 16), 4,096 of them a
# replica (about 64k tokens, a fraction of what one GPU's KV cache holds: what the index forgets
# early costs one prefill, what it remembers that the engine dropped costs one too).
BLOCK_CHARS = 64
INDEX_BLOCKS = 4096
# The most of that index one request takes: its prompt's first blocks, a quarter of it (about 16k
# tokens). A prompt of 8,192 blocks, one request of one tenant within the 1 MiB body, took all of
# it and every other tenant's prompts on that replica were forgotten.
REQUEST_BLOCKS = INDEX_BLOCKS // 4
# The most block hashes a prompt is named by, the llm model's bound on its prefix_keys (runtime
# contract.MAX_PREFIX_KEYS, which refuses a request with more: tests/test_gateway_kv_events.py holds
# the two equal; the gateway runs where the runtime package is not installed, so it cannot import
# it). About half a million characters; what a longer prompt holds past them is not named.
MAX_PREFIX_KEYS = 8192
# What a token of the answer costs against a character of prompt: decoding a token takes about as
# long as reading 16 characters of prompt (4 tokens) on the CPU engine measured here (SmolLM2:
# 3.5 ms a prompt token, about 15 ms a decoded token on one thread); it matters only to weigh the
# requests ahead in a full batch.
DECODE_CHARS = 16
ENGINE_INDEX = 65536        # most states a replica's engine is believed to hold (kvEvents)
OTHERS_FOR_S = 2.0          # how long the requests other gateways sent a replica count (kvEvents: see the module)
PROBE_FRESH_S = 0.25        # kvEvents: a replica whose events were read this recently is not asked again (to_probe)
ROUTING_POLICIES = ("leastInFlight", "prefix", "kvEvents")
# kvEvents: the cursor goes first in the JSON body sent to a replica, in a slot of CURSOR_WIDTH
# characters reserved when the body is encoded and written in place when the replica is known (no
# copy of a long prompt per attempt); the slot's spare characters become whitespace after the string.
CURSOR_FIELD = b'{"kv_events_after":"'
CURSOR_WIDTH = 64


def affinity(text: str) -> int:
    """The affinity of a request that begins with `text` (its first AFFINITY_CHARS characters)."""
    return int.from_bytes(hashlib.blake2b(text[:AFFINITY_CHARS].encode("utf-8", "replace"), digest_size=8).digest(),
                          "big")


@dataclass(frozen=True)
class Beginning:
    """What prefix routing knows of a request: its affinity, the chained hash of each whole block
    of its prompt, the prompt's length and the tokens its answer may take; with kvEvents
    (`precise`), how many of its blocks lie before its last message."""
    affinity: int
    blocks: tuple[int, ...]
    chars: int
    answer: int = 0
    before_last: int = 0
    precise: bool = False

    def keys(self) -> list[str]:
        """The block hashes as the engine is sent them (prefix_keys): 16 hex digits each."""
        return [f"{b:016x}" for b in self.blocks]

    def work(self, held_blocks: int) -> int:
        """What reading this prompt and writing its answer costs a replica that holds its first
        `held_blocks` blocks, in characters of prompt (see DECODE_CHARS)."""
        return self.chars - held_blocks * BLOCK_CHARS + self.answer * DECODE_CHARS


def beginning(text: str, answer: int = 0, last_at: int = 0, precise: bool = False) -> Beginning:
    """The Beginning of a request whose prompt reads `text`, whose last message starts at character
    `last_at`, and whose answer may take `answer` tokens: its first MAX_PREFIX_KEYS whole blocks
    (and how many of those lie before its last message)."""
    h = hashlib.blake2b(digest_size=8)
    blocks = []
    for start in range(0, min(len(text) - BLOCK_CHARS + 1, MAX_PREFIX_KEYS * BLOCK_CHARS), BLOCK_CHARS):
        h.update(text[start:start + BLOCK_CHARS].encode("utf-8", "surrogatepass"))
        blocks.append(int.from_bytes(h.copy().digest(), "big"))
    return Beginning(affinity(text), tuple(blocks), len(text), answer, min(last_at // BLOCK_CHARS, len(blocks)), precise)


def _rank(key: int, address: Address) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{address[0]}|{address[1]}".encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Service:
    key: ServiceKey
    generate_model: str             # the Triton model behind the OpenAI routes
    v2_model: str                   # the Triton model /v2/models/<service name>/... maps to
    openai: bool                    # listed in /v1/models and reachable through the OpenAI routes
    llm: bool = False               # serves the llm model interface (format tensorrt-llm)
    chat_template: str | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    scales_to_zero: bool = False    # autoscaling.minReplicas 0
    degraded: str | None = None     # why it cannot serve now (Degraded=True), if it cannot
    desired: int | None = None      # status.replicas: what the operator asked for (None: not reported yet)
    ready: int | None = None        # status.readyReplicas
    slo: tuple[str, float] | None = None   # (which latency, its target in seconds): spec.autoscaling.slo
    embeddings: bool = False        # spec.openai.task embeddings: /v1/embeddings, not the text routes
    prefix_routing: bool = False    # spec.routing.policy prefix or kvEvents (see the module)
    kv_events: bool = False         # spec.routing.policy kvEvents: what replicas hold, as their engines say
    batch_slots: int | None = None  # spec.engine.maxBatchSize of an LLM service: requests a replica runs at once

    def starting(self) -> bool:
        """Replicas are on their way: a service that scales from zero (the held requests ask for one), a
        new one the operator has not reported on, or one with fewer ready replicas than it asked for."""
        if self.scales_to_zero or self.desired is None:
            return True
        return (self.ready or 0) < self.desired

    @property
    def id(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


def service_from(obj: dict[str, Any]) -> Service | None:
    """The gateway's view of one InferenceService object (lenient: a field it does not know is
    ignored, a malformed object is skipped)."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    spec = obj.get("spec") or {}
    if not name or not isinstance(spec, dict) or meta.get("deletionTimestamp"):
        return None
    model = spec.get("model") or {}
    fmt = model.get("format")
    llm = fmt == "tensorrt-llm"
    triton_model = model.get("name") or (LLM_MODEL if llm else name)
    openai = spec.get("openai") or {}
    enabled = openai.get("enabled")
    if enabled is None:
        enabled = fmt == "tensorrt-llm" or bool(openai)
    autoscaling = spec.get("autoscaling") or {}
    degraded = None
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Degraded" and cond.get("status") == "True":
            degraded = f"{cond.get('reason')}: {cond.get('message')}".rstrip(": ")
    max_tokens = openai.get("defaultMaxTokens")
    generate_model = openai.get("model") or triton_model
    v2_model = triton_model
    if not (isinstance(generate_model, str) and is_model_name(generate_model)
            and isinstance(v2_model, str) and is_model_name(v2_model)):
        return None  # the CRD refuses such names; an object that has one anyway is not served
    policy = _routing(spec, llm and generate_model == LLM_MODEL)
    return Service(
        key=(namespace, name),
        generate_model=generate_model,
        v2_model=v2_model,
        openai=bool(enabled),
        llm=llm,
        chat_template=openai.get("chatTemplate"),
        default_max_tokens=int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else DEFAULT_MAX_TOKENS,
        scales_to_zero=autoscaling.get("minReplicas") == 0,
        degraded=degraded,
        desired=_count(status.get("replicas")),
        ready=_count(status.get("readyReplicas")),
        slo=_slo(autoscaling),
        embeddings=openai.get("task") == "embeddings" and not llm,
        prefix_routing=policy in ("prefix", "kvEvents"),
        kv_events=policy == "kvEvents" and llm,
        batch_slots=_batch_slots(spec) if llm else None,
    )


def _routing(spec: dict[str, Any], own_llm: bool) -> str:
    """spec.routing.policy; unset: kvEvents where the service generates on the operator's own LLM
    model (whose engine reports what its cache holds), leastInFlight otherwise."""
    routing = spec.get("routing") if isinstance(spec.get("routing"), dict) else {}
    policy = routing.get("policy")
    if policy in ROUTING_POLICIES:
        return policy
    return "kvEvents" if own_llm else "leastInFlight"


def _batch_slots(spec: dict[str, Any]) -> int:
    """spec.engine.maxBatchSize, or the CRD's default."""
    engine = spec.get("engine") if isinstance(spec.get("engine"), dict) else {}
    value = engine.get("maxBatchSize")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_MAX_BATCH


def _slo(autoscaling: dict[str, Any]) -> tuple[str, float] | None:
    """The service level the gateway counts requests against (latency, target in seconds):
    spec.autoscaling.slo, or targetP99LatencyMs as an end-to-end one."""
    level = raw_service_level(autoscaling)
    return None if level is None else level[:2]


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def ready_addresses(slice_: dict[str, Any], port_name: str = "http") -> tuple[Address, ...]:
    """host:port of every ready endpoint of one EndpointSlice, on the port named `port_name`."""
    port = next((p.get("port") for p in slice_.get("ports") or [] if p.get("name") == port_name), None)
    if not isinstance(port, int):
        return ()
    out = []
    for ep in slice_.get("endpoints") or []:
        conditions = ep.get("conditions") or {}
        # "ready" unset means ready (discovery.k8s.io/v1 EndpointConditions); a terminating
        # endpoint is not ready.
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        for address in (ep.get("addresses") or [])[:1]:
            out.append((address, port))
    return tuple(out)


def url(address: Address, scheme: str = "http") -> str:
    host, port = address
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def cursor_slot(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with the slot for the kvEvents cursor first (Router.write_cursor fills it)."""
    return {"kv_events_after": "0" * CURSOR_WIDTH, **body}


def has_cursor_slot(body: Any) -> bool:
    """Whether `body` is a request with a cursor slot (written or not) that can be written in place."""
    end = len(CURSOR_FIELD) + CURSOR_WIDTH + 1
    return isinstance(body, bytearray) and body.startswith(CURSOR_FIELD) and body[end:end + 1] == b","


@dataclass
class Router:
    port_name: str = "http"   # the EndpointSlice port requests go to ("https" behind a TLS terminator)
    services: dict[ServiceKey, Service] = field(default_factory=dict)
    slices: dict[tuple[str, str], tuple[ServiceKey, tuple[Address, ...]]] = field(default_factory=dict)
    in_flight: dict[Address, int] = field(default_factory=dict)
    work: dict[Address, int] = field(default_factory=dict)       # the work in flight (Beginning.work)
    held: dict[Address, OrderedDict[int, None]] = field(default_factory=dict)   # the index (see the module)
    stored: dict[Address, dict[int, int]] = field(default_factory=dict)   # kvEvents: block hash -> blocks, as the engine said
    cursors: dict[Address, tuple[str, int]] = field(default_factory=dict)   # kvEvents: (engine run, last event read)
    others: dict[Address, tuple[int, float]] = field(default_factory=dict)  # kvEvents: other gateways' requests, when told
    heard: dict[Address, float] = field(default_factory=dict)    # kvEvents: when its engine's events were last read
    reading: dict[Address, tuple[dict[int, int], float]] = field(default_factory=dict)  # kvEvents: prompts being read, when told
    ejected: dict[Address, float] = field(default_factory=dict)   # replicas that failed to connect -> until when
    share: dict[Address, float] = field(default_factory=dict)     # share of the recent requests routed by cost (pick)
    _endpoints: dict[ServiceKey, tuple[Address, ...]] = field(default_factory=dict)
    _unnamed_port: set[tuple[str, str]] = field(default_factory=set)   # slices without port_name
    _live: dict[Address, int] = field(default_factory=dict)   # ready endpoints -> services that list them
    _turn: int = 0

    # -- updates from the watches (each returns the services whose ready endpoints changed) -----

    def set_service(self, obj: dict[str, Any] | None, old: dict[str, Any] | None = None) -> None:
        if obj is None:
            if old is not None:
                meta = old.get("metadata") or {}
                self.services.pop((meta.get("namespace") or "default", meta.get("name")), None)
            return
        svc = service_from(obj)
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name"))
        if svc is None:
            self.services.pop(key, None)
        else:
            self.services[key] = svc

    def set_slice(self, obj: dict[str, Any] | None, old: dict[str, Any] | None = None) -> set[ServiceKey]:
        src = obj if obj is not None else old
        if src is None:
            return set()
        meta = src.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        slice_key = (namespace, meta.get("name") or "")
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        before = self.slices.get(slice_key)
        self._unnamed_port.discard(slice_key)
        if obj is None or not service:
            self.slices.pop(slice_key, None)
        else:
            self.slices[slice_key] = ((namespace, service), ready_addresses(obj, self.port_name))
            if not self._has_port(obj):
                self._unnamed_port.add(slice_key)
        touched = {entry[0] for entry in (before, self.slices.get(slice_key)) if entry is not None}
        return self._recompute(touched)

    def replace_slices(self, objs: Iterable[dict[str, Any]]) -> set[ServiceKey]:
        """A fresh listing of every slice (after a relist)."""
        touched = {k for k, _ in self.slices.values()}
        self.slices = {}
        self._unnamed_port = set()
        for obj in objs:
            meta = obj.get("metadata") or {}
            service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
            if service:
                ns = meta.get("namespace") or "default"
                slice_key = (ns, meta.get("name") or "")
                self.slices[slice_key] = ((ns, service), ready_addresses(obj, self.port_name))
                if not self._has_port(obj):
                    self._unnamed_port.add(slice_key)
        touched |= {k for k, _ in self.slices.values()}
        return self._recompute(touched)

    def _recompute(self, services: set[ServiceKey]) -> set[ServiceKey]:
        changed = set()
        for key in services:
            addresses = tuple(sorted({a for k, addrs in self.slices.values() if k == key for a in addrs}))
            if addresses != self._endpoints.get(key, ()):
                changed.add(key)
                before = set(self._endpoints.get(key, ()))
                for gone in before - set(addresses):
                    self._live[gone] -= 1
                    if not self._live[gone]:
                        del self._live[gone]
                    self.forget(gone)     # not ready (restarting, going): its cache is not to be trusted
                for new in set(addresses) - before:
                    self._live[new] = self._live.get(new, 0) + 1
                if addresses:
                    self._endpoints[key] = addresses
                else:
                    self._endpoints.pop(key, None)
        return changed

    # -- reads ------------------------------------------------------------------------------------

    def endpoints(self, key: ServiceKey) -> tuple[Address, ...]:
        return self._endpoints.get(key, ())

    def find(self, name: str) -> list[Service]:
        return [s for k, s in self.services.items() if k[1] == name]

    def _has_port(self, slice_: dict[str, Any]) -> bool:
        return any(p.get("name") == self.port_name for p in slice_.get("ports") or [])

    def usable(self, key: ServiceKey, now: float) -> tuple[Address, ...]:
        """The ready endpoints not ejected at `now` (a replica that failed to connect sits out a while)."""
        addresses = self._endpoints.get(key, ())
        if not self.ejected:
            return addresses
        for address in [a for a, until in self.ejected.items() if until <= now]:
            del self.ejected[address]
        return tuple(a for a in addresses if a not in self.ejected)

    def eject(self, address: Address, until: float) -> None:
        self.ejected[address] = until
        self.forget(address)

    def forget(self, address: Address) -> None:
        """Forget what `address` holds."""
        self.held.pop(address, None)
        self.stored.pop(address, None)
        self.cursors.pop(address, None)
        self.others.pop(address, None)
        self.heard.pop(address, None)
        self.reading.pop(address, None)
        self.share.pop(address, None)

    def load(self, address: Address, now: float) -> int:
        """The requests in flight at `address`: this gateway's, and those the other gateways sent it
        as its engine last told (for OTHERS_FOR_S seconds)."""
        n = self.in_flight.get(address, 0)
        told = self.others.get(address)
        if told is not None:
            if now - told[1] < OTHERS_FOR_S:
                return n + told[0]
            del self.others[address]
        return n

    def why_no_endpoint(self, key: ServiceKey) -> str:
        """Why `key` has no ready endpoint, as the EndpointSlices say it."""
        mine = [sk for sk, (service, _) in self.slices.items() if service == key]
        if not mine:
            return "no EndpointSlice lists its pods"
        if all(sk in self._unnamed_port for sk in mine):
            return f"its EndpointSlices have no port named {self.port_name!r}"
        return "its EndpointSlices list no ready endpoint"

    def pick(self, key: ServiceKey, now: float = 0.0, begins: Beginning | None = None) -> Address | None:
        """The usable endpoint with the fewest requests in flight (round robin among equals), or,
        for a request whose Beginning is known, the one where it costs least (see the module)."""
        addresses = self.usable(key, now)
        if not addresses:
            return None
        if begins is not None and len(addresses) > 1:
            self._forget_reading(now)
            load = {a: self.load(a, now) for a in addresses}
            svc = self.services.get(key)
            slots = (svc.batch_slots if svc is not None else None) or DEFAULT_MAX_BATCH
            bound = math.ceil(AFFINITY_LOAD * (sum(load.values()) + 1) / len(addresses))
            even = 1.0 / len(addresses)              # the share a replica new to the router counts as having had
            # One more than the bound only where at most one request would then wait for the batch,
            # and any number where the replica's recent share is under the bound's (see the module).
            room = [a for a in addresses if load[a] < bound or load[a] == bound <= slots
                    or self.share.get(a, even) < AFFINITY_LOAD * even] or list(addresses)
            chosen = min(room, key=lambda a: (self.cost(a, begins, slots, load[a]), -_rank(begins.affinity, a)))
            keep = 1.0 - 1.0 / SHARE_PICKS
            for a in addresses:
                self.share[a] = self.share.get(a, even) * keep + (1.0 - keep if a == chosen else 0.0)
            return chosen
        least = min(self.in_flight.get(a, 0) for a in addresses)
        candidates = [a for a in addresses if self.in_flight.get(a, 0) == least]
        self._turn += 1
        return candidates[self._turn % len(candidates)]

    def holds(self, address: Address, begins: Beginning) -> int:
        """How many of the first blocks of `begins` `address` holds: as this gateway last sent them
        there (less what its engine said it evicted), or, for a precise Beginning, as its engine
        said it stored them, whichever is more."""
        n = 0
        index = self.held.get(address)
        if index:
            for block in begins.blocks:
                if block not in index:
                    break
                n += 1
        if not begins.precise:
            return n
        for names in (self.stored.get(address), self.reading.get(address, ({}, 0.0))[0]):
            if names:
                for depth in range(len(begins.blocks), n, -1):
                    if names.get(begins.blocks[depth - 1]) == depth:
                        n = depth
                        break
        return n

    def cursor(self, address: Address) -> str:
        """This gateway's cursor into the engine events of `address` ("" before the first)."""
        run, seq = self.cursors.get(address, ("", 0))
        return f"{run}:{seq}" if run else ""

    def write_cursor(self, body: bytearray, address: Address) -> None:
        """Write this gateway's cursor for `address` into the slot `body` reserves for it
        (cursor_slot); a cursor too long for the slot is sent as "" (the engine then answers with
        what it holds, as after a restart)."""
        cursor = self.cursor(address).encode()
        if len(cursor) > CURSOR_WIDTH:
            cursor = b""
        start = len(CURSOR_FIELD)
        body[start:start + CURSOR_WIDTH + 1] = cursor + b'"' + b" " * (CURSOR_WIDTH - len(cursor))

    def to_probe(self, key: ServiceKey, begins: Beginning, now: float) -> list[Address]:
        """kvEvents: the replicas to ask what their engines hold before `begins` is routed. When no
        replica is known to hold its prompt up to its last message, another gateway may have just
        sent the earlier turns (or the tenant's system prompt) somewhere, and the answer that says
        so went to that gateway: the usable replicas whose events were last read (or asked for)
        PROBE_FRESH_S ago or more, counted as asked now (one that cannot answer is not asked by every
        request). None for a prompt of one message, or when a replica is known to hold it."""
        if not begins.precise or not begins.before_last:
            return []
        self._forget_reading(now)
        addresses = self.usable(key, now)
        if len(addresses) < 2 or any(self.holds(a, begins) >= begins.before_last for a in addresses):
            return []
        asked = [a for a in addresses if now - self.heard.get(a, -math.inf) >= PROBE_FRESH_S]
        for a in asked:
            self.heard[a] = now
        return asked

    def _forget_reading(self, now: float) -> None:
        """What engines said they were reading OTHERS_FOR_S ago is stored by now, or their events say not."""
        for address in [a for a, (_, told) in self.reading.items() if now - told >= OTHERS_FOR_S]:
            del self.reading[address]

    def observe(self, address: Address, text: str, now: float = 0.0) -> None:
        """Apply what the engine of `address` said it did since this gateway's cursor (an answer's
        kv_events: runtime/triton_runtime/serving/kv_events.py, KvEvents.since). Answers may come back
        out of order: one that says nothing newer than what was applied is ignored, and of the
        events one brings, those applied already are skipped. What cannot be read is ignored (and logged): routing goes on."""
        if address not in self._live or address in self.ejected:
            return    # the replica left while its answer was on its way
        try:
            out = json.loads(text)
            run, seq = out["epoch"], out["seq"]
            if not (isinstance(run, str) and 0 < len(run) <= 32 and run.isalnum() and isinstance(seq, int)
                    and not isinstance(seq, bool) and seq >= 0):
                raise ValueError("no run and sequence number")
            known_run, known_seq = self.cursors.get(address, ("", 0))
            self.heard[address] = now
            if run == known_run and seq < known_seq:
                return    # an older answer: what it says is being read may be done and stored
            reading = out.get("reading")
            if reading is None:
                self.reading.pop(address, None)
            else:
                self.reading[address] = (dict(_held(reading)), now)
            load = out.get("load")
            if isinstance(load, int) and not isinstance(load, bool) and 0 <= load <= 1 << 20:
                # this gateway's requests there are still in flight (the one answered among them)
                self.others[address] = (max(0, load - self.in_flight.get(address, 0)), now)
            if "snapshot" in out:
                if run == known_run and seq <= known_seq:
                    return
                self.stored[address] = dict(_held(out["snapshot"]))
                if known_run and run != known_run:
                    self.held.pop(address, None)     # restarted: what was sent there is gone
            elif run == known_run and seq > known_seq:
                after = out["after"]
                if not (isinstance(after, int) and 0 <= after <= known_seq):
                    raise ValueError("events from after a cursor this gateway never sent")
                stored = self.stored.setdefault(address, {})
                sent = self.held.get(address, {})
                for kind, block, depth in out["events"][max(0, known_seq - after):]:
                    if kind == "stored":
                        if len(stored) < ENGINE_INDEX or _block(block) in stored:
                            stored[_block(block)] = _depth(depth)
                    elif kind == "removed":
                        if stored.get(_block(block)) == _depth(depth):
                            del stored[_block(block)]
                        sent.pop(_block(block), None)
            else:
                return
            self.cursors[address] = (run, seq)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            log.debug("kv events from %s:%d not read: %s", address[0], address[1], e)

    def cost(self, address: Address, begins: Beginning, slots: int, load: int | None = None) -> float:
        """What `begins` costs at `address`: its own work there, plus, when the replica's `slots`
        are all taken (by its `load`: this gateway's requests in flight unless said), what is left
        of the work in flight ahead of it: of the requests that must end first, those running are
        half done on average (a request found at a random moment of its run has half of it left),
        those waiting not begun; another gateway's request weighs as this gateway's do on
        average, or as this one would cold when this gateway has none there."""
        own = begins.work(self.holds(address, begins))
        n = self.in_flight.get(address, 0) if load is None else load
        must_end = max(0, n - slots + 1)
        if not must_end:
            return own
        mine = self.in_flight.get(address, 0)
        mean = self.work.get(address, 0) / mine if mine else begins.work(0)
        running = min(must_end, slots)
        return own + mean * (must_end - running / 2)

    def acquire(self, address: Address, begins: Beginning | None = None) -> int:
        """Count a request sent to `address`; with its Beginning, its work (returned: give it back to
        `release`) and its blocks, which the replica holds from now on."""
        self.in_flight[address] = self.in_flight.get(address, 0) + 1
        if begins is None:
            return 0
        work = begins.work(self.holds(address, begins))
        self.work[address] = self.work.get(address, 0) + work
        if begins.blocks:
            index = self.held.setdefault(address, OrderedDict())
            for block in reversed(begins.blocks[:REQUEST_BLOCKS]):   # a prompt's first blocks are forgotten last
                index[block] = None
                index.move_to_end(block)
            while len(index) > INDEX_BLOCKS:
                index.popitem(last=False)
        return work

    def release(self, address: Address, work: int = 0) -> None:
        left = self.in_flight.get(address, 0) - 1
        if left > 0:
            self.in_flight[address] = left
        else:
            self.in_flight.pop(address, None)
        rest = self.work.get(address, 0) - work
        if left > 0 and rest > 0:
            self.work[address] = rest
        else:
            self.work.pop(address, None)


def _block(text: Any) -> int:
    if not (isinstance(text, str) and len(text) == 16 and all(c in "0123456789abcdef" for c in text)):
        raise ValueError("a block hash is 16 hex digits")
    return int(text, 16)


def _depth(value: Any) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 20):
        raise ValueError("a depth is a positive count of blocks")
    return value


def _held(snapshot: Any) -> Iterable[tuple[int, int]]:
    if not isinstance(snapshot, list):
        raise ValueError("a snapshot is a list")
    for block, depth in snapshot[:ENGINE_INDEX]:
        yield _block(block), _depth(depth)
