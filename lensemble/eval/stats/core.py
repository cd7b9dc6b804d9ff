"""Shared pieces of :mod:`lensemble.eval.stats`: the :class:`Interval` result type, the
``Direction`` / ``Alternative`` literals and the input checks every procedure runs (also used by
the study's gap recovery, :mod:`lensemble.study.gap`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from lensemble.errors import EvaluationError

Direction = Literal["increase", "decrease"]
Alternative = Literal["two-sided", "greater", "less"]


# --------------------------------------------------------------------------------------------
# Result types


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval ``[low, high]`` at ``level`` (e.g. 0.95)."""

    low: float
    high: float
    level: float
    method: str

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def as_tuple(self) -> tuple[float, float]:
        return (self.low, self.high)


# --------------------------------------------------------------------------------------------
# Input checks (shared with the study's gap recovery, lensemble.study.gap)


def as_rng(seed: int | np.random.Generator) -> np.random.Generator:
    """``seed`` itself when it is a Generator, else a fresh ``default_rng(seed)``."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise EvaluationError(f"seed must be an int or numpy Generator, got {type(seed).__name__}")
    return np.random.default_rng(int(seed))


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float in (0, 1), else EvaluationError."""
    if not (0.0 < float(alpha) < 1.0):
        raise EvaluationError(f"alpha must be in (0, 1), got {alpha}")
    return float(alpha)


def as_1d(x, name: str, *, min_n: int = 1) -> np.ndarray:
    """``x`` as a finite float64 array (n,), one value per unit, n >= ``min_n``."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise EvaluationError(f"{name} must be 1-D (one value per unit), got shape {arr.shape}")
    if arr.size < min_n:
        raise EvaluationError(f"{name} needs at least {min_n} values, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise EvaluationError(f"{name} contains non-finite values")
    return arr
