"""The evaluation's numbers in ``<run>/summary.json``, so a script reads a run's answer from one file.

The coordinator writes ``summary.json`` when the rounds end (rounds, hashes, per-round metrics);
:func:`write_evaluation_summary` then adds one key, ``evaluation``, after every ``lensemble run``
(``null`` with ``--no-eval``). A resumed run's coordinator rewrites the file and the evaluation that
follows adds the key again. Rates are in [0, 1], differences in rate units (0.1 = 10 points), all
intervals two-sided 95 %:

``evaluation``
    ``schema_version`` (1), ``episodes`` (tasks per arm), ``split`` ("heldout"), ``env_id``,
    ``eval_seed``, ``goal_spec_hash`` (the tasks every arm ran; each arm repeats its own);
``evaluation.arms.<arm>``, arm in federated, warmstart, random (+ local-0 … local-(C−1), twin with ``--baselines``)
    ``successes``, ``episodes``, ``success_rate``, ``success_ci`` (Wilson), ``planner``, ``checkpoint_hash``,
    ``goal_spec_hash``, ``report`` (its EvalReport, relative to the run folder);
``evaluation.comparisons.<a>-vs-<b>`` for federated-vs-random, federated-vs-warmstart, warmstart-vs-random
    ``difference`` (a − b), ``ci`` (Newcombe), ``reading`` ("better", "worse" or "indistinguishable"; the
    rule of :mod:`lensemble.report.answer`), ``interval`` ("newcombe-paired" when both EvalReports recorded
    their episodes on the same tasks, else "newcombe-hybrid-score", the unpaired interval);
``evaluation.baselines`` (``null`` without ``--baselines``)
    ``local_steps``, ``local_batch_size``, ``twin_steps``, ``twin_batch_size`` (every baseline starts
    from the summary's ``warmstart_hash``), ``local_success_rate`` (S_local: the mean of the local
    models' rates);
``evaluation.gap_recovery`` (``null`` without ``--baselines``)
    ``reference`` ("twin"), ``defined``, ``rho`` and ``rho_ci`` (``null`` when undefined), ``reason``
    (why undefined), ``fed_minus_local`` / ``_ci``, ``twin_minus_local`` / ``_ci``, ``units`` ("tasks"),
    ``n_units``, ``n_boot``, ``bootstrap_seed``, ``alpha``, ``method``, ``n_indeterminate``, ``error``
    (why ρ was not computed at all, e.g. a single task; then every number is ``null``). A ρ bound is
    the string "inf" or "-inf" when bootstrap replicates with a zero gap reach it (JSON has no
    infinity).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.eval.reports import EvalReport
from lensemble.report.answer import compare_success, paired_outcomes
from lensemble.report.baselines import TWIN, BaselineResult
from lensemble.report.run_eval import EVAL_DIR, RunEvaluation, load_summary
from lensemble.study.files import atomic_write

SCHEMA_VERSION = 1
#: The pairs whose differences the report tables and the answer reads (a − b).
COMPARISONS = (("federated", "random"), ("federated", "warmstart"), ("warmstart", "random"))


def _number(x: float | None):
    """A JSON-safe number: ±inf as the strings "inf" / "-inf" (JSON has no infinity)."""
    if x is None or math.isfinite(x):
        return x
    return "inf" if x > 0 else "-inf"


def arm_record(arm: str, rep: EvalReport) -> dict:
    lo, hi = rep.success_ci
    return {"successes": rep.n_successes, "episodes": rep.n_episodes, "success_rate": rep.success_rate,
            "success_ci": [lo, hi], "planner": rep.planner, "checkpoint_hash": rep.checkpoint_hash,
            "goal_spec_hash": rep.goal_spec_hash, "report": f"{EVAL_DIR}/{arm}.json"}


def gap_record(baselines: BaselineResult) -> dict:
    g = baselines.gap
    if g is None:
        return {"reference": TWIN, "defined": False, "rho": None, "rho_ci": None, "reason": None,
                "fed_minus_local": None, "fed_minus_local_ci": None, "twin_minus_local": None,
                "twin_minus_local_ci": None, "units": "tasks", "n_units": None, "n_boot": None,
                "bootstrap_seed": None, "alpha": None, "method": None, "n_indeterminate": None,
                "error": baselines.gap_error}
    return {"reference": TWIN, "defined": g.defined, "rho": g.rho,
            "rho_ci": None if g.rho_ci is None else [_number(x) for x in g.rho_ci], "reason": g.reason,
            "fed_minus_local": g.numerator, "fed_minus_local_ci": list(g.numerator_ci),
            "twin_minus_local": g.denominator, "twin_minus_local_ci": list(g.denominator_ci),
            "units": "tasks", "n_units": g.n_seeds, "n_boot": g.n_boot, "bootstrap_seed": g.seed,
            "alpha": g.alpha, "method": g.method, "n_indeterminate": g.n_indeterminate, "error": None}


def evaluation_block(cfg: LensembleConfig, evaluation: RunEvaluation | None,
                     baselines: BaselineResult | None = None) -> dict | None:
    """The ``evaluation`` value of ``summary.json`` (module docstring); None without an evaluation."""
    if evaluation is None:
        return None
    reports = {**evaluation.reports, **(baselines.reports if baselines else {})}
    comparisons = {}
    for a, b in COMPARISONS:
        ra, rb = evaluation.reports[a], evaluation.reports[b]
        c = compare_success(a, ra.n_successes, ra.n_episodes, b, rb.n_successes, rb.n_episodes,
                            outcomes=paired_outcomes(ra, rb))
        comparisons[f"{a}-vs-{b}"] = {"difference": c.difference, "ci": list(c.ci), "reading": c.reading,
                                      "interval": c.interval}
    block = {"schema_version": SCHEMA_VERSION, "episodes": evaluation.episodes, "split": "heldout",
             "env_id": cfg.env.id, "eval_seed": cfg.eval.seed, "goal_spec_hash": evaluation.goal_spec_hash,
             "arms": {arm: arm_record(arm, rep) for arm, rep in reports.items()}, "comparisons": comparisons,
             "baselines": None, "gap_recovery": None}
    if baselines is not None:
        twin = baselines.trained[TWIN]
        local = next(t for a, t in baselines.trained.items() if a != TWIN)
        block["baselines"] = {"local_steps": local.steps, "local_batch_size": local.batch_size,
                              "twin_steps": twin.steps, "twin_batch_size": twin.batch_size,
                              "local_success_rate": baselines.local_rate}
        block["gap_recovery"] = gap_record(baselines)
    return block


def write_evaluation_summary(run_dir: str | Path, cfg: LensembleConfig, evaluation: RunEvaluation | None,
                             baselines: BaselineResult | None = None) -> dict:
    """Set ``summary.json``'s ``evaluation`` key (every other key as the coordinator wrote it, in its
    format: sorted keys, indent 1); returns the whole summary."""
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    summary["evaluation"] = evaluation_block(cfg, evaluation, baselines)
    atomic_write(run_dir / "summary.json", json.dumps(summary, indent=1, sort_keys=True, default=str))
    return summary


__all__ = ["COMPARISONS", "evaluation_block", "write_evaluation_summary"]
