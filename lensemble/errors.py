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


class CollectionError(LensembleError):
    """Data collection cannot produce the frames its settings define (e.g. a simulator worker whose
    numerical code path differs from the one every collection uses: lensemble/numerics.py)."""

    code = "collection_failed"
    default_remediation = ("Collect in a fresh `lensemble` process with MKL_CBWR unset for its workers "
                           "(they set MKL_CBWR=COMPATIBLE themselves).")


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


class SecureAggregationAborted(FaultToleranceExceeded):
    """A SecAgg+ round lost so many participants that the sum can no longer be unmasked."""

    code = "secagg_aborted"
    default_remediation = (
        "Fewer than federation.secagg_threshold participants finished the SecAgg+ stages: bring "
        "nodes back, raise federation.round_timeout_s, or lower federation.secagg_threshold (>= 2)."
    )


class SecureSumRejected(LensembleError):
    """The unmasked sum broke its bound (non-finite, wrong size, or norm above C x bound)."""

    code = "secagg_sum_rejected"
    fail_closed = True
    default_remediation = (
        "Nothing was committed for this round. A participant sent a malformed masked vector or the "
        "unmasking failed: read the sites' logs, then resume the run to retry the round."
    )


class FolderInUse(LensembleError):
    """Another process holds the exclusive lock on a run or participant-state folder."""

    code = "folder_in_use"
    default_remediation = (
        "Wait for the other run to finish or stop it, or give this run another folder "
        "(run_dir / federation.state_dir)."
    )


class StorageError(LensembleError):
    """A write failed because of where it went (a full disk, a read-only folder), not a bug.

    ``public_reason`` is a fixed phrase with no value from the site in it, so it may cross the
    silo boundary in :func:`error_label`: a coordinator learns *why* a participant failed.
    """

    code = "storage_failed"
    public_reason = "a write failed at its site"
    default_remediation = "Check the named folder's filesystem, then run the same command again to resume."


class DiskFull(StorageError):
    code = "disk_full"
    public_reason = "No space left on device at its site"
    default_remediation = (
        "Free space on the named folder's filesystem (or give run_dir / federation.state_dir another "
        "disk), then run the same command again: the run resumes from its last committed round."
    )


class ReadOnlyFolder(StorageError):
    code = "read_only"
    public_reason = "a folder it writes is read-only at its site"
    default_remediation = (
        "Make the named folder writable (permissions, or remount read-write), or give the run a writable "
        "run_dir / federation.state_dir; then run the same command again."
    )


class RunOwnerGone(LensembleError):
    """This process was started for a run whose driver is gone, or whose run folder another
    process now holds: it must not write into that folder again (an orphaned federation)."""

    code = "run_owner_gone"
    fail_closed = True
    default_remediation = (
        "Nothing more was written. Run the same command again to resume from the last committed round."
    )


class ParticipantFailed(RoundError):
    """A participant's error as the coordinator may see it: a code and a class name, no text.

    The original message can hold private values (a shape, a file name, a number from the silo),
    so only :func:`error_label` of it crosses the silo boundary.
    """

    code = "participant_failed"
    default_remediation = "Read the participant's own log at its site; the round can be retried."


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


def error_label(exc: BaseException) -> str:
    """``"ClassName [code]"`` for a Lensemble error, else ``"ClassName"``: no message text (a
    :class:`StorageError` adds its fixed ``public_reason``, which holds no value from the site).

    What a participant's failure may say to the coordinator (summary.json, state headers, logs).
    """
    return class_label(type(exc)) if isinstance(exc, LensembleError) else type(exc).__name__


def class_label(cls: type[LensembleError]) -> str:
    """``"ClassName [code]"``, plus ``": <public_reason>"`` for a :class:`StorageError` class."""
    label = f"{cls.__name__} [{cls.code}]"
    # a storage error's fixed phrase ("No space left on device at its site") names the cause
    reason = cls.public_reason if issubclass(cls, StorageError) else None
    return f"{label}: {reason}" if reason else label


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
    "SecureAggregationAborted",
    "SecureSumRejected",
    "FolderInUse",
    "StorageError",
    "DiskFull",
    "ReadOnlyFolder",
    "RunOwnerGone",
    "ParticipantFailed",
    "NonDeterministicAggregation",
    "PrivacyBudgetExceeded",
    "error_label",
    "class_label",
]
