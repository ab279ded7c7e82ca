"""The gpuscaler API: pydantic models of the TrainingJob resource (source of truth for the CRD)."""

from gpuscaler.api.trainingjob import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    CheckpointSpec,
    Constraints,
    Objective,
    PrecisionName,
    SpotPolicy,
    TrainingAmount,
    TrainingJob,
    TrainingJobSpec,
    TransformerSpec,
    WorkloadSpec,
    parse_duration,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "CheckpointSpec",
    "Constraints",
    "Objective",
    "PrecisionName",
    "SpotPolicy",
    "TrainingAmount",
    "TrainingJob",
    "TrainingJobSpec",
    "TransformerSpec",
    "WorkloadSpec",
    "parse_duration",
]
