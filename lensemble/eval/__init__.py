"""Scoring one checkpoint: the closed loop, the planner, the evaluation ladder, reports, statistics.

* :func:`evaluate` (:mod:`~lensemble.eval.closed_loop`): closed-loop latent-MPC success in the
  real environment, plus the ladder, as one :class:`EvalReport`;
* :class:`Planner` (:mod:`~lensemble.eval.mpc`): CEM / MPPI / iCEM over predictor rollouts;
* :class:`LadderSettings` (:mod:`~lensemble.eval.ladder`): the ladder's protocol knobs;
* :mod:`~lensemble.eval.controls`: the goal-posing expert and the random-action control;
* :class:`EvalReport` (:mod:`~lensemble.eval.reports`): the scalar-only record of one evaluation;
* :mod:`~lensemble.eval.stats`: intervals, paired tests, Holm, power and the verdict rule that the
  study (:mod:`lensemble.study`) builds on.

Names resolve on first use (PEP 562), as in the top package: the study's analysis imports
:mod:`lensemble.eval.stats` and must not pull in torch and the environments through this file.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "evaluate": "lensemble.eval.closed_loop",
    "Planner": "lensemble.eval.mpc",
    "LadderSettings": "lensemble.eval.ladder",
    "EvalReport": "lensemble.eval.reports",
    "wilson_interval": "lensemble.eval.stats",
    "compare_proportions": "lensemble.eval.stats",
    "paired_difference": "lensemble.eval.stats",
    "verdict": "lensemble.eval.stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lensemble.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
