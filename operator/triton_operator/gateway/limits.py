"""What each tenant may hold of the gateway at once (pure): request bytes in memory, places in a
service's hold queue, requests in flight. Tenants are API keys, named by their digest.

The gateway's memory is mostly request bodies: one waiting for a service to wake is kept whole
until a replica is ready. Without bounds one key could fill the memory limit (and the hold queue
everyone shares) on its own, so:

- `BodyBudget`: every body is counted from before it is read (its Content-Length, or the largest
  body allowed when the client does not say) until the replica has it; past the gateway's budget a
  request gets 503, past a key's share of it 429;
- `Holds`: a service's hold queue is bounded, and one key may take only its share of it; all
  services together are bounded too;
- `InFlight`: requests one key has open (held, reading, or being answered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .routing import ServiceKey


def share(total: int, fraction: float) -> int:
    """A tenant's share of `total`: at least 1 (a key can always have one)."""
    return max(1, math.floor(total * fraction))


@dataclass
class BodyBudget:
    limit: int              # bytes of request bodies in memory, all keys
    per_key: int            # bytes one key may have in memory
    used: int = 0
    by_key: dict[str, int] = field(default_factory=dict)

    def reserve(self, who: str, n: int) -> str | None:
        """None when `n` bytes fit; else whose limit they would pass ("gateway" or "key")."""
        mine = self.by_key.get(who, 0)
        if mine + n > self.per_key:
            return "key"
        if self.used + n > self.limit:
            return "gateway"
        self.used += n
        self.by_key[who] = mine + n
        return None

    def release(self, who: str, n: int) -> None:
        self.used -= n
        left = self.by_key.get(who, 0) - n
        if left > 0:
            self.by_key[who] = left
        else:
            self.by_key.pop(who, None)


@dataclass
class Holds:
    per_service: int        # requests held for one service
    per_key: int            # of which one key may hold
    total: int              # requests held for all services
    per_key_total: int | None = None   # of which one key may hold (None: total): its share over all services
    count: int = 0
    by_service: dict[ServiceKey, int] = field(default_factory=dict)
    by_service_and_key: dict[tuple[ServiceKey, str], int] = field(default_factory=dict)
    by_key: dict[str, int] = field(default_factory=dict)

    def admit(self, service: ServiceKey, who: str) -> str | None:
        """None when the request may wait; else which bound is reached ("key": the key's share of
        the service's queue, "key_total": its share of all, "service", "total"). Without a share of
        the total, one key spread over many services filled it, and every other key's requests for
        a waking service were refused."""
        if self.by_service_and_key.get((service, who), 0) >= self.per_key:
            return "key"
        if self.by_key.get(who, 0) >= (self.per_key_total or self.total):
            return "key_total"
        if self.by_service.get(service, 0) >= self.per_service:
            return "service"
        if self.count >= self.total:
            return "total"
        self.count += 1
        self.by_service[service] = self.by_service.get(service, 0) + 1
        self.by_service_and_key[(service, who)] = self.by_service_and_key.get((service, who), 0) + 1
        self.by_key[who] = self.by_key.get(who, 0) + 1
        return None

    def leave(self, service: ServiceKey, who: str) -> None:
        self.count -= 1
        _decrement(self.by_service, service)
        _decrement(self.by_service_and_key, (service, who))
        _decrement(self.by_key, who)

    def held(self, service: ServiceKey) -> int:
        return self.by_service.get(service, 0)


@dataclass
class InFlight:
    by_key: dict[str, int] = field(default_factory=dict)

    def acquire(self, who: str, cap: int) -> bool:
        mine = self.by_key.get(who, 0)
        if mine >= cap:
            return False
        self.by_key[who] = mine + 1
        return True

    def release(self, who: str) -> None:
        _decrement(self.by_key, who)


def _decrement(table: dict, key: object) -> None:  # type: ignore[type-arg]
    left = table.get(key, 0) - 1
    if left > 0:
        table[key] = left
    else:
        table.pop(key, None)
