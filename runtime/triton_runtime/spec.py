"""What identifies an engine, and the cache key built from it (pure)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8", "int4-awq")
# FP8 kernels need Ada Lovelace (8.9) or Hopper (9.0); A100 (8.0) has none.
MIN_CAPABILITY = {"fp8": (8, 9), "bf16": (8, 0)}
# Precisions quantize.py builds by calibrating on sample text.
CALIBRATED = ("fp8", "int4-awq")


class SpecError(ValueError):
    """A request that cannot be built; the message tells the user what to change."""


@dataclass(frozen=True)
class EngineSpec:
    source: str
    precision: str
    compute_capability: str
    revision: str = "main"
    tensor_parallelism: int = 1
    pipeline_parallelism: int = 1
    max_batch_size: int = 64
    max_input_len: int = 2048
    max_seq_len: int = 4096
    max_num_tokens: int = 8192
    # Where quantize.py's calibration text comes from (fp8, int4-awq); None: its default download.
    calibration_dataset: str | None = None

    def validate(self) -> EngineSpec:
        if self.precision not in PRECISIONS:
            raise SpecError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        try:
            major, minor = (int(x) for x in self.compute_capability.split("."))
        except ValueError:
            raise SpecError(f"compute capability {self.compute_capability!r} is not MAJOR.MINOR") from None
        need = MIN_CAPABILITY.get(self.precision)
        if need and (major, minor) < need:
            raise SpecError(
                f"precision {self.precision} needs compute capability {need[0]}.{need[1]} or higher; this "
                f"GPU has {self.compute_capability}. Use fp16, int8 or int4-awq on it.")
        for name in ("tensor_parallelism", "pipeline_parallelism", "max_batch_size", "max_input_len",
                     "max_seq_len", "max_num_tokens"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name} must be at least 1")
        if self.calibration_dataset and self.precision not in CALIBRATED:
            raise SpecError(f"a calibration dataset applies only to precisions {', '.join(CALIBRATED)}, "
                            f"not {self.precision}")
        if self.max_input_len >= self.max_seq_len:
            raise SpecError("max_input_len must be less than max_seq_len (which counts input and output)")
        return self

    def fields(self) -> dict:
        """The identifying fields; unset optional ones are left out, so adding one keeps old keys."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def key(self, trtllm_version: str) -> str:
        """Everything that makes two engines incompatible, hashed; readable prefix for humans."""
        fields = {**self.fields(), "trtllm_version": trtllm_version}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        name = self.source.rstrip("/").rsplit("/", 1)[-1].lower()
        safe = "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in name)[:40]
        cc = self.compute_capability.replace(".", "")
        return f"{safe}-{self.precision}-tp{self.tensor_parallelism}-sm{cc}-{digest}"
