"""Lensemble: federated training and honest evaluation of action-conditioned JEPA world models.

The public surface is imported lazily so ``import lensemble`` stays fast (torch, flwr and the
environment suite load only when the function that needs them is first used).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # configuration and artifacts
    "LensembleConfig": "lensemble.config.schema",
    "load_config": "lensemble.config.loader",
    "derive": "lensemble.config.seeds",
    "save_checkpoint": "lensemble.artifacts.checkpoint",
    "load_checkpoint": "lensemble.artifacts.checkpoint",
    "RunManifest": "lensemble.artifacts.manifest",
    # training, federation, evaluation, gauge
    "train_local": "lensemble.training.trainer",
    "run_federated_simulation": "lensemble.federation.simulation",
    "evaluate": "lensemble.eval.closed_loop",
    "EvalReport": "lensemble.eval.reports",
    "Planner": "lensemble.eval.mpc",
    "frame_drift": "lensemble.gauge.drift",
    "FrameDriftReport": "lensemble.gauge.drift",
    "procrustes_align": "lensemble.gauge.procrustes",
    "effective_dim": "lensemble.model.collapse",
    # the study
    "gap_recovery": "lensemble.study.gap",
    "run_study": "lensemble.study.runner",
    "run_ablation_ladder": "lensemble.study.runner",
    "lambda_anc_sweep": "lensemble.study.runner",
    "rebuild_report": "lensemble.study.report",
}
_ERRORS = ("LensembleError", "ConfigError", "ProbeError", "GaugeError", "DegenerateProcrustes",
           "ArtifactError", "CheckpointIntegrityError", "SchemaVersionMismatch", "EvaluationError",
           "ResidencyViolation", "RoundError", "FaultToleranceExceeded", "NonDeterministicAggregation",
           "PrivacyBudgetExceeded")
_EXPORTS.update({name: "lensemble.errors" for name in _ERRORS})

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lensemble' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
