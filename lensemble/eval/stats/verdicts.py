"""**Verdicts**: :func:`verdict` turns an estimate, its interval and the registered effect size δ
into "confirmed", "falsified" or "inconclusive" by a fixed rule (see its docstring);
:func:`test_verdict` reaches the same three labels from two error-controlled tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from lensemble.errors import EvaluationError
from lensemble.eval.stats.core import Direction, Interval

# --------------------------------------------------------------------------------------------
# Verdicts


@dataclass(frozen=True)
class Verdict:
    """Outcome of one registered claim: ``label`` is confirmed / falsified / inconclusive."""

    label: Literal["confirmed", "falsified", "inconclusive"]
    reason: str
    estimate: float
    ci: tuple[float, float]
    delta: float
    direction: Direction


def verdict(
    estimate: float,
    ci: Interval | tuple[float, float],
    *,
    delta: float,
    direction: Direction = "increase",
    p_value: float | None = None,
    alpha: float = 0.05,
) -> Verdict:
    """Decide a registered claim "the effect is at least ``delta`` in ``direction``".

    Work in the hypothesised direction: for "decrease" every number is negated first, so the
    claim always reads "effect >= δ > 0". With interval [L, U] and point estimate e:

    1. **falsified** if U < δ: the interval excludes every effect as large as the registered one
       (this includes a significant effect in the wrong direction, and a real but too-small one).
    2. **confirmed** if L > 0 *and* e >= δ (*and*, when ``p_value`` is given, e.g. a
       Holm-adjusted one, ``p_value <= alpha``): the effect is distinguishable from zero in the
       hypothesised direction and its best estimate reaches the registered size. Since e <= U,
       a confirmed claim is never also falsified.
    3. **inconclusive** otherwise: the interval still contains 0, or it excludes 0 but the
       estimate falls short of δ while δ remains compatible with the data.

    The interval should be at the level the study registered (and match any multiplicity
    correction). No verdict is ever read off a point estimate alone.
    """
    if direction not in ("increase", "decrease"):
        raise EvaluationError(f"direction must be 'increase' or 'decrease', got {direction!r}")
    if not (math.isfinite(delta) and delta > 0):
        raise EvaluationError(
            f"delta must be a positive finite effect size (its sign is given by direction), got {delta}"
        )
    low, high = ci.as_tuple() if isinstance(ci, Interval) else (float(ci[0]), float(ci[1]))
    values = (estimate, low, high)
    if not all(math.isfinite(v) for v in values):
        raise EvaluationError(f"estimate and interval must be finite, got {values}")
    if low > high:
        raise EvaluationError(f"interval is inverted: [{low}, {high}]")
    if p_value is not None and not 0.0 <= p_value <= 1.0:
        raise EvaluationError(f"p_value must be in [0, 1], got {p_value}")

    s = 1.0 if direction == "increase" else -1.0
    e, lo, hi = s * estimate, min(s * low, s * high), max(s * low, s * high)
    word = "above" if direction == "increase" else "below"
    span = f"[{low:.4g}, {high:.4g}]"
    if hi < delta:
        label = "falsified"
        reason = f"the interval {span} excludes every {direction} of {delta:.4g} or more (registered)"
    elif lo > 0 and e >= delta and (p_value is None or p_value <= alpha):
        label = "confirmed"
        reason = f"the interval {span} excludes 0 and the estimate {estimate:.4g} reaches {delta:.4g}"
    elif lo > 0 and e >= delta:
        label = "inconclusive"
        reason = f"the interval {span} excludes 0 but the p-value {p_value:.4g} exceeds {alpha:.4g}"
    elif lo > 0:
        label = "inconclusive"
        reason = (
            f"the effect is {word} 0 but the estimate {estimate:.4g} falls short of the registered "
            f"{delta:.4g}, which the interval {span} still allows"
        )
    else:
        label = "inconclusive"
        reason = f"the interval {span} contains 0 and still allows the registered effect {delta:.4g}"
    return Verdict(label, reason, float(estimate), (float(low), float(high)), float(delta), direction)


def test_verdict(
    estimate: float,
    ci: Interval | tuple[float, float],
    *,
    delta: float,
    direction: Direction,
    p_confirm: float,
    p_falsify: float,
    alpha: float = 0.05,
) -> Verdict:
    """The registered verdict from two error-controlled tests (both p-values already adjusted for
    multiplicity, the same way):

    1. **confirmed** if ``p_confirm`` (H0: no effect in the registered direction) is at most α and
       the estimate reaches δ;
    2. **falsified** if ``p_falsify`` (H0: the effect is at least δ) is at most α: the data rule out
       an effect as large as registered, with the error rate of a test;
    3. **inconclusive** otherwise.

    The two cannot both hold (a falsifying test needs the estimate below δ). The interval is
    reported, and must agree: a confirmation whose interval does not exclude 0 on the registered
    side is refused as an internal error by the caller's guard.
    """
    if direction not in ("increase", "decrease"):
        raise EvaluationError(f"direction must be 'increase' or 'decrease', got {direction!r}")
    if not (math.isfinite(delta) and delta > 0):
        raise EvaluationError(f"delta must be a positive finite effect size, got {delta}")
    for name, p in (("p_confirm", p_confirm), ("p_falsify", p_falsify)):
        if not 0.0 <= p <= 1.0:
            raise EvaluationError(f"{name} must be in [0, 1], got {p}")
    low, high = ci.as_tuple() if isinstance(ci, Interval) else (float(ci[0]), float(ci[1]))
    e = estimate if direction == "increase" else -estimate
    span = f"[{low:.4g}, {high:.4g}]"
    if p_confirm <= alpha and e >= delta:
        label, reason = "confirmed", (f"H0 'no {direction}' rejected (adjusted p {p_confirm:.3g} <= {alpha:g}) and the "
                                      f"estimate {estimate:.4g} reaches {delta:.4g}; 95% interval {span}")
    elif p_falsify <= alpha:
        label, reason = "falsified", (f"H0 'a {direction} of {delta:.4g} or more' rejected (adjusted p "
                                      f"{p_falsify:.3g} <= {alpha:g}); estimate {estimate:.4g}, 95% interval {span}")
    elif p_confirm <= alpha:
        label, reason = "inconclusive", (f"an effect in the registered direction (adjusted p {p_confirm:.3g}) but the "
                                         f"estimate {estimate:.4g} falls short of {delta:.4g}, which is not ruled out "
                                         f"(adjusted p {p_falsify:.3g})")
    else:
        label, reason = "inconclusive", (f"neither 'no effect' (adjusted p {p_confirm:.3g}) nor 'an effect of "
                                         f"{delta:.4g} or more' (adjusted p {p_falsify:.3g}) is rejected at {alpha:g}; "
                                         f"95% interval {span}")
    return Verdict(label, reason, float(estimate), (float(low), float(high)), float(delta), direction)
