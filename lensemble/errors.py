"""Error taxonomy (DESIGN.md §9).

Every error carries a stable machine-readable ``code`` and a one-line ``remediation`` telling
the user what to do next. Fail-closed errors (``fail_closed = True``) must never be caught and
ignored: they signal a broken invariant (residency, integrity, determinism), not a transient fault.
"""

from __future__ import annotations


class LensembleError(Exception):
    """Base class: ``code`` is stable across releases, ``remediation`` is one actionable line."""

    code = "internal"
    fail_closed = False
    default_remediation = "This is a bug in Lensemble; please report it with the run folder."

    def __init__(self, message: str, *, remediation: str | None = None, **details):
        self.message = message
        self.remediation = remediation or self.default_remediation
        self.details = details
        super().__init__(message)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message} (fix: {self.remediation})"


class ConfigError(LensembleError):
    code = "config_invalid"
    default_remediation = "Correct the named config field (see configs/ and docs/configuration.md)."


class ProbeError(LensembleError):
    code = "probe_invalid"
    fail_closed = True
    default_remediation = "Use the public probe whose hash the run was trained with (run manifest)."


class GaugeError(LensembleError):
    code = "gauge_failed"
    default_remediation = "Check the probe embeddings and the gauge settings (configs/gauge/)."


class DegenerateProcrustes(GaugeError):
    code = "procrustes_degenerate"
    default_remediation = (
        "The embeddings are (near) rank-deficient: use more probe frames, check for collapse, "
        "or lower gauge.singular_floor."
    )


class ArtifactError(LensembleError):
    code = "artifact_invalid"
    default_remediation = "Re-create the artifact with this version of Lensemble."


class CheckpointIntegrityError(ArtifactError):
    code = "checkpoint_integrity"
    fail_closed = True
    default_remediation = "The checkpoint was modified or truncated; restore it from its source."


class SchemaVersionMismatch(ArtifactError):
    code = "schema_version_mismatch"
    default_remediation = "Upgrade Lensemble to a version that reads this schema."


class EvaluationError(LensembleError):
    code = "evaluation_failed"
    default_remediation = "Check the environment id and the eval config (configs/eval/)."


class ResidencyViolation(LensembleError):
    code = "residency_violation"
    fail_closed = True
    default_remediation = (
        "Only pseudo-gradients, public-probe embeddings and scalar metrics may leave a silo."
    )


class RoundError(LensembleError):
    code = "round_failed"
    default_remediation = "Inspect the round log; the round can be retried."


class FaultToleranceExceeded(RoundError):
    code = "fault_tolerance_exceeded"
    default_remediation = (
        "Too few participants replied: bring nodes back, raise federation.round_timeout_s, "
        "or lower federation.min_participants."
    )


class NonDeterministicAggregation(LensembleError):
    code = "agg_nondeterministic"
    fail_closed = True
    default_remediation = "The aggregation is not bitwise reproducible; report this as a bug."


class PrivacyBudgetExceeded(LensembleError):
    code = "dp_budget_exceeded"
    fail_closed = True
    default_remediation = (
        "Raise privacy.target_epsilon, lower the number of rounds, or raise privacy.noise_multiplier."
    )


__all__ = [
    "LensembleError",
    "ConfigError",
    "ProbeError",
    "GaugeError",
    "DegenerateProcrustes",
    "ArtifactError",
    "CheckpointIntegrityError",
    "SchemaVersionMismatch",
    "EvaluationError",
    "ResidencyViolation",
    "RoundError",
    "FaultToleranceExceeded",
    "NonDeterministicAggregation",
    "PrivacyBudgetExceeded",
]
