"""What the planning decides for one service, as data (no deciding here): `Option`, one GPU class
at one GPU count and whether the service may use it; `Candidates`, where the service may run
(`choice` makes them); `Assignment`, everything rendering writes out (`assign` makes it).
Rendering imports this module and never the ones that decide."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .fit import Layout, Problem

USABLE = "Fits"


@dataclass(frozen=True)
class Option:
    """One GPU class at one GPU count, and whether the service may use it."""

    gpu_class: str
    count: int
    reason: str = USABLE               # USABLE, or a CamelCase reason it is not used
    message: str = ""
    cost_per_hour: float | None = None
    decode_tokens_per_s_bound: float | None = None
    weights_gib: float | None = None
    available_gib: float | None = None
    layout: Layout | None = None       # nodes, TP x PP, memory per GPU

    @property
    def usable(self) -> bool:
        return self.reason == USABLE

    @property
    def ms_per_token_bound(self) -> float | None:
        b = self.decode_tokens_per_s_bound
        return None if not b else round(1000 / b, 2)


@dataclass(frozen=True)
class Candidates:
    """The preferred option, the spill-over targets in order (usable only), the options left out
    with their reasons, and for class auto the whole ranking. `error` is set when nothing can run."""

    preferred: Option | None
    spill: tuple[Option, ...] = ()
    skipped: tuple[Option, ...] = ()
    ranking: tuple[Option, ...] = ()
    error: Problem | None = None
    notes: tuple[str, ...] = field(default=())

    def usable(self) -> list[Option]:
        return ([self.preferred] if self.preferred else []) + list(self.spill)

    def usable_names(self) -> list[str]:
        return [o.gpu_class for o in self.usable()]

    def option(self, gpu_class: str) -> Option | None:
        return next((o for o in self.usable() if o.gpu_class == gpu_class), None)


@dataclass(frozen=True)
class Assignment:
    """Where one service runs, decided before anything is rendered: the class choice, the
    replicas of each GPU class (the preferred class always among them; empty when the choice
    failed), and for format tensorrt-llm the classes whose model is prepared (the serving pods of
    the others are held at 0 replicas; None: every class, the steady state offline callers render)."""

    candidates: Candidates
    replicas: Mapping[str, int] = field(default_factory=dict)
    prepared: frozenset[str] | None = None
