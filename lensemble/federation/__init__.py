"""Framework-free federation core: pseudo-gradients, wire codec, outer step, validation, DP ledger.

Nothing in this package (outside ``flower/``) imports Flower; the Flower apps are thin adapters
over these functions, so the round logic can be tested in-process.
"""

from __future__ import annotations

from lensemble.federation.codec import decode_delta, encode_delta, payload_nbytes, quant_ratio
from lensemble.federation.outer import OuterOptimizer, aggregate, aggregate_checked, state_digest
from lensemble.federation.pseudograd import (
    Layout,
    Release,
    clip,
    flatten,
    l2_norm,
    participant_pipeline,
    pseudo_gradient,
    unflatten,
)
from lensemble.federation.validation import (
    Update,
    ValidationResult,
    check_egress,
    require_quorum,
    retry_or_raise,
    validate_updates,
)


def __getattr__(name: str):
    # opacus is imported only when the DP ledger is actually used
    if name == "PrivacyLedger":
        from lensemble.federation.privacy import PrivacyLedger

        return PrivacyLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Layout",
    "Release",
    "pseudo_gradient",
    "flatten",
    "unflatten",
    "l2_norm",
    "clip",
    "participant_pipeline",
    "encode_delta",
    "decode_delta",
    "payload_nbytes",
    "quant_ratio",
    "OuterOptimizer",
    "aggregate",
    "aggregate_checked",
    "state_digest",
    "Update",
    "ValidationResult",
    "validate_updates",
    "require_quorum",
    "retry_or_raise",
    "check_egress",
    "PrivacyLedger",
]
