"""The API of triton-operator: InferenceService and GPUClass, as pydantic models.

These models are the one source of truth: the CRDs in crds/ are generated from them
(`triton-operator crds`), and the operator parses every object it reads through them.
Field descriptions become `kubectl explain` text, so they are written for users.

- base.py      the group and version, the base Model, validation errors as "field.path: message"
- syntax.py    Kubernetes' syntax rules (names, label keys, quantities, durations) and CEL helpers
- gpuclass.py  GPUClass, the cluster-scoped catalog of GPU classes
- model.py     spec.model: the model, its precision, and what the planner reads of a precision
- serving.py   how the pods serve: spec.server, spec.engine, rollout, routing, spec.openai
- spec.py      InferenceService and its spec (model, gpu, autoscaling, the serving parts, ...)
- status.py    InferenceService's status
- kinds.py     where InferenceService and GPUClass live in the API (paths for the clients)

This module only re-exports what the rest of the code imports.
"""

from .base import API_VERSION, GROUP, VERSION, describe_validation_error, first_error
from .gpuclass import AUTO_CLASS, AUTO_RESERVED_MESSAGE, GPUClass, GPUClassSpec, Toleration
from .model import (BYTES_PER_PARAMETER, CALIBRATED_PRECISIONS, CALIBRATION_MESSAGE, INT8_LLM_MESSAGE,
                    MIN_COMPUTE_CAPABILITY, RESERVED_MODEL_MESSAGE, RESERVED_MODEL_NAMES, TRITON_MODEL_NAME,
                    TRITON_MODEL_NAME_MAX_LENGTH, UNBUILT_LLM_FAMILIES, UNBUILT_LLM_MESSAGE, ModelSpec,
                    admitted_precisions)
from .serving import ContainerResources, EngineSpec
from .spec import (AUTO_FALLBACK_MESSAGE, AUTO_PARAMETERS_MESSAGE, COUNT_ZERO_MESSAGE, MAX_REPLICAS, MODEL_NAME_RULE,
                   RESERVED_SERVICE_MESSAGE, SERVICE_NAME_RULES, SLO_BOTH_MESSAGE, SLO_LATENCIES,
                   SPILL_TARGET_MESSAGE, AutoscalingSpec, InferenceService, InferenceServiceSpec, SLOSpec)
from .status import ClassPlacement, InferenceServiceStatus
from .syntax import DNS_1035_LABEL, DNS_LABEL, DURATION_MAX_LENGTH, cel

__all__ = [
    # identity and errors
    "API_VERSION", "GROUP", "VERSION", "describe_validation_error", "first_error",
    # Kubernetes syntax and CEL (crdgen)
    "DNS_1035_LABEL", "DNS_LABEL", "DURATION_MAX_LENGTH", "cel",
    # GPUClass
    "AUTO_CLASS", "AUTO_RESERVED_MESSAGE", "GPUClass", "GPUClassSpec", "Toleration",
    # InferenceService
    "AUTO_FALLBACK_MESSAGE", "AUTO_PARAMETERS_MESSAGE", "BYTES_PER_PARAMETER", "CALIBRATED_PRECISIONS",
    "CALIBRATION_MESSAGE", "COUNT_ZERO_MESSAGE", "INT8_LLM_MESSAGE", "RESERVED_MODEL_MESSAGE",
    "MODEL_NAME_RULE", "RESERVED_MODEL_NAMES", "RESERVED_SERVICE_MESSAGE",
    "SLO_BOTH_MESSAGE", "SLO_LATENCIES", "SLOSpec", "MAX_REPLICAS", "MIN_COMPUTE_CAPABILITY",
    "SERVICE_NAME_RULES", "SPILL_TARGET_MESSAGE", "TRITON_MODEL_NAME", "TRITON_MODEL_NAME_MAX_LENGTH",
    "UNBUILT_LLM_FAMILIES", "UNBUILT_LLM_MESSAGE",
    "AutoscalingSpec", "ContainerResources", "EngineSpec", "InferenceService", "InferenceServiceSpec", "ModelSpec",
    "ClassPlacement", "InferenceServiceStatus",
]
