"""Gauge control: Procrustes alignment, frame-drift diagnostics, anchor, backstop, distillation.

See docs/gauge.md for the formulas and the conventions (row convention z' = z Q, float64 linear
algebra, relative singular-value floor).
"""

from lensemble.gauge.anchor import FrameAnchor, differentiable_polar, select_landmarks
from lensemble.gauge.backstop import align_and_redifference, backstop_metrics, rotate_state_dict
from lensemble.gauge.distill import DistillResult, aligned_consensus, distill_encoder
from lensemble.gauge.drift import (
    GLOBAL_KEY,
    DriftToGlobal,
    FrameDriftReport,
    Misalignment,
    PairSampling,
    drift_magnitudes,
    frame_drift,
    frobenius_drift,
    geodesic_angle_deg,
    misalignment,
    pair_key,
    principal_angles,
)
from lensemble.gauge.procrustes import polar_factors, procrustes_align

__all__ = [
    "procrustes_align",
    "polar_factors",
    "differentiable_polar",
    "principal_angles",
    "geodesic_angle_deg",
    "frobenius_drift",
    "drift_magnitudes",
    "pair_key",
    "GLOBAL_KEY",
    "frame_drift",
    "FrameDriftReport",
    "DriftToGlobal",
    "PairSampling",
    "Misalignment",
    "misalignment",
    "FrameAnchor",
    "select_landmarks",
    "rotate_state_dict",
    "align_and_redifference",
    "backstop_metrics",
    "aligned_consensus",
    "distill_encoder",
    "DistillResult",
]
