"""`fixed:N` (pure): N replicas, never changed."""

from __future__ import annotations

from dataclasses import dataclass

from ..simulation import View


@dataclass
class Fixed:
    replicas: int
    name: str = "fixed"
    interval: float = 60.0
    sample_interval: float = 0.0

    def decide(self, view: View) -> tuple[int, str]:
        return self.replicas, f"fixed at {self.replicas}"

    def sample(self, view: View) -> None:  # pragma: no cover
        pass
