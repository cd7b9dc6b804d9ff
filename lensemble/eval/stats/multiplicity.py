"""**Multiplicity**: Holm (step-down), returning reject flags and adjusted p-values."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lensemble.errors import EvaluationError
from lensemble.eval.stats.core import check_alpha

# --------------------------------------------------------------------------------------------
# Multiplicity


@dataclass(frozen=True)
class MultipleTestResult:
    """Reject flags and adjusted p-values, in the order the p-values were given."""

    reject: tuple[bool, ...]
    adjusted: tuple[float, ...]
    alpha: float
    method: str


def _check_pvalues(p_values) -> np.ndarray:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise EvaluationError("p_values must be a non-empty 1-D sequence")
    if not np.all((p >= 0) & (p <= 1)):
        raise EvaluationError("p-values must lie in [0, 1]")
    return p


def holm(p_values, *, alpha: float = 0.05) -> MultipleTestResult:
    """Holm's step-down procedure (controls the familywise error rate, uniformly beats Bonferroni).

    Sort p ascending; the i-th smallest (1-based) is compared with alpha / (m - i + 1) and the
    procedure stops at the first non-rejection. Adjusted p-values are the running maximum of
    (m - i + 1)·p_(i), capped at 1, so ``reject == adjusted <= alpha``.
    """
    alpha = check_alpha(alpha)
    p = _check_pvalues(p_values)
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = p[order] * (m - np.arange(m))
    # The running max enforces the step-down stop: once one hypothesis survives, later ones do too.
    adj_sorted = np.minimum(1.0, np.maximum.accumulate(scaled))
    adj = np.empty(m)
    adj[order] = adj_sorted
    return MultipleTestResult(
        tuple(bool(x) for x in adj <= alpha), tuple(float(x) for x in adj), alpha, "holm"
    )
