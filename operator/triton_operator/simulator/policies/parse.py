"""Policies as users write them (pure): `ours`, `oracle`, `fixed:N`, and the baselines
configured as a user configures them (`--policy hpa:...`, `keda:...`, `kpa:...`), each with the
upstream defaults for the keys left out (cited on the classes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ...api import AutoscalingSpec
from .common import METRICS, PolicyError


POLICY_KEYS: dict[str, tuple[str, ...]] = {
    "hpa": ("metric", "target", "stabilization"),
    "keda": ("metric", "target", "activation", "polling", "cooldown", "stabilization"),
    "kpa": ("target", "utilization", "window"),
    "oracle": ("headroom",),
}
USAGE = ("ours, oracle[:headroom=H], fixed:N, hpa[:metric=M,target=N,stabilization=S], "
         "keda[:metric=M,target=N,activation=A,polling=S,cooldown=S], kpa[:target=N,utilization=U,window=S] "
         f"(M: {'|'.join(METRICS)})")
# key -> (lowest allowed, whether the lowest itself is allowed, what to say, highest allowed)
_DAY = 86400.0
_RANGES = {
    "target": (0.0, False, "a number > 0", 1e6),
    "stabilization": (0.0, True, "a number of seconds >= 0", _DAY),
    "activation": (0.0, True, "a number >= 0", 1e6),
    # KEDA polls in whole seconds: shorter is not KEDA (and polling=1e-9 never ended)
    "polling": (1.0, True, "a number of seconds >= 1 (KEDA's pollingInterval is in whole seconds)", _DAY),
    "cooldown": (0.0, True, "a number of seconds >= 0", _DAY),
    "utilization": (0.0, False, "a percentage in (0, 100]", 100.0),
    "window": (6.0, True, "a number of seconds >= 6 (Knative's minimum)", 3600.0),
    "headroom": (-1.0, False, "a number > -1 (a share of the saturated need: 0.1 is 10 % over it)", 100.0),
}
MAX_FIXED = 1000   # maxReplicas' own limit


@dataclass(frozen=True)
class PolicySpec:
    """A parsed --policy: the family and its settings; `name` is the text as given (the run's name)."""

    family: str
    settings: tuple[tuple[str, float | str], ...] = ()
    name: str = ""

    def get(self, key: str, default: float | str | None = None) -> float | str | None:
        return dict(self.settings).get(key, default)


def parse_policy(text: str | PolicySpec) -> PolicySpec:
    """`ours`, `oracle[:headroom=H]`, `fixed:N`, or a baseline with its settings as a user configures it.
    Keys left out take the upstream defaults (see HPA, KEDA and KPA). Bare `hpa` and `keda` scale
    on the queue per pod with the InferenceService's targetQueueDepth as the target (a metric and
    its target have no upstream default, so they are given together or not at all); bare `kpa` is
    Knative with its defaults (target 100, utilization 70 %)."""
    if isinstance(text, PolicySpec):
        return text
    raw = text.strip()
    family, sep, rest = raw.partition(":")
    if family == "ours" or (family == "oracle" and not sep):
        if sep:
            raise PolicyError(f"policy {text!r}: {family} takes no settings")
        return PolicySpec(family, (), family)
    if family == "fixed":
        if not (rest.isascii() and rest.isdigit() and int(rest) >= 1):   # "²" is a digit to isdigit(), not to int()
            raise PolicyError(f"policy {text!r}: fixed:N needs a whole number N >= 1")
        if int(rest) > MAX_FIXED:
            raise PolicyError(f"policy {text!r}: N is at most {MAX_FIXED} (maxReplicas' own limit)")
        return PolicySpec("fixed", (("replicas", float(int(rest))),), f"fixed:{int(rest)}")
    keys = POLICY_KEYS.get(family)
    if keys is None:
        raise PolicyError(f"unknown policy {text!r}; choose from {USAGE}")
    values: dict[str, float | str] = {}
    for item in rest.split(",") if sep else []:
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not key or not value:
            raise PolicyError(f"policy {text!r}: expected key=value, got {item.strip()!r}")
        if key not in keys:
            raise PolicyError(f"policy {text!r}: unknown key {key!r}; {family} takes {', '.join(keys)}")
        if key in values:
            raise PolicyError(f"policy {text!r}: {key} is given twice")
        if key == "metric":
            if value not in METRICS:
                raise PolicyError(f"policy {text!r}: metric must be one of {', '.join(METRICS)}, got {value!r}")
            values[key] = value
            continue
        lowest, inclusive, what, highest = _RANGES[key]
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number) and number > highest and key != "utilization":   # its range says so already
            raise PolicyError(f"policy {text!r}: {key} must be at most {highest:g}, got {value!r}")
        if (not math.isfinite(number) or number < lowest or (number == lowest and not inclusive)
                or number > highest):
            raise PolicyError(f"policy {text!r}: {key} must be {what}, got {value!r}")
        values[key] = number
    if family in ("hpa", "keda") and ("metric" in values) != ("target" in values):
        raise PolicyError(f"policy {text!r}: metric and target go together (neither has an upstream default), "
                          f"e.g. {family}:metric=concurrency,target=48")
    return PolicySpec(family, tuple(sorted(values.items())), raw)


# The HPA does not scale to zero on a Pods metric (the HPAScaleToZero gate and an Object/External
# metric are needed); KEDA (activation, cooldownPeriod) and Knative (activator, grace period) do,
# and are modelled.
NO_SCALE_TO_ZERO = ("hpa",)


def check_min_replicas(names: Sequence[str | PolicySpec], spec: AutoscalingSpec) -> None:
    """minReplicas 0 runs only with policies whose scale to zero is modelled."""
    if spec.min_replicas > 0:
        return
    bad = [p.name for p in map(parse_policy, names) if p.family in NO_SCALE_TO_ZERO]
    if bad:
        raise PolicyError(f"minReplicas 0: {', '.join(bad)} cannot scale to zero (an HPA on a Pods metric "
                          "never goes below one replica); simulate it with minReplicas 1, or use keda or kpa")
