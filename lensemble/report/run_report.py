"""The report of one federated run: plot and explain what the run and its evaluation measured.

The evaluation itself is :mod:`lensemble.report.run_eval` (the federated model, the warm start and
random actions on one task set) and, with ``lensemble run --baselines``,
:mod:`lensemble.report.baselines` (the local models, the data-parallel twin and gap recovery ρ).

:func:`write_run_report` reads ``summary.json``, ``drift/round-XXXX.json`` and those EvalReports
and writes ``report.md``, ``report.html`` and ``figures/*.png`` into the run folder, and the
evaluation's numbers into ``summary.json`` (:mod:`lensemble.report.run_summary`). Its
:attr:`RunReport.lines` are the plain-language answer the CLI prints last; the words come from
:mod:`lensemble.report.answer`'s rules. Every file goes through ``guard_export``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.eval.reports import EvalReport
from lensemble.federation.stability import stability_sentence
from lensemble.observability.progress import format_duration
from lensemble.report.answer import (
    communication_sentence,
    compare_success,
    drift_sentence,
    format_bytes,
    gap_sentence,
    paired_outcomes,
    smallest_resolvable_difference,
    success_sentence,
)
from lensemble.report.baselines import TWIN, BaselineResult, arm_label, baseline_arms, source_of
from lensemble.report.figures import (
    COLOURS,
    bytes_panel,
    empty_panel,
    lines_panel,
    participant_colour,
    pyplot,
    save_figure,
    success_panel,
)
from lensemble.report.run_eval import (  # the evaluation's names stay importable from here
    ARM_LABEL,
    ARM_TEXT,
    ARMS,
    EVAL_DIR,
    RunEvaluation,
    evaluate_run,
    load_run_evaluation,
    load_summary,
)
from lensemble.report.run_summary import write_evaluation_summary
from lensemble.study.files import atomic_write
from lensemble.study.report import render_html

FIG_DIR = "figures"
FIGURES = ("overview.png", "success.png", "drift.png", "gauge.png", "losses.png", "communication.png")

#: What the coordinator's gauge/* keys mean; a key not listed here is shown under its own name.
GAUGE_KEYS = {
    # the variance-weighted drift first: what the answer leads with (docs/gauge.md, §3)
    "gauge/drift_subspace_angle_deg": "mean angle within the global model's 95 %-energy subspace (°)",
    "gauge/drift_rotation_share": "mean share of the participants' disagreement with the global model a rotation explains",
    "gauge/drift_rel_residual_before": "mean ‖E_c − E_global‖/‖E_global‖ before alignment, participants to global",
    "gauge/drift_rel_residual_after": "the same after the Procrustes rotation",
    "gauge/pairwise_subspace_angle_deg": "mean angle between participants within the 95 %-energy subspace (°)",
    "gauge/pairwise_rotation_share": "mean share of their disagreement a rotation explains, between participants",
    "gauge/pairwise_rel_residual_before": "mean relative disagreement between participants before alignment",
    "gauge/pairwise_rel_residual_after": "the same after the Procrustes rotation",
    "gauge/drift_angle_deg": "mean full-space geodesic angle, participants' frames to the global model's (°)",
    "gauge/procrustes_residual": "mean ‖Q − I‖_F, participants to the global model",
    "gauge/pairwise_angle_deg": "mean full-space geodesic angle between participants (°)",
    "gauge/pairwise_residual": "mean ‖Q − I‖_F between participants",
    "gauge/angle_to_warmstart_deg": "full-space geodesic angle of the global model's frame to the warm start's (°)",
    "gauge/effective_dim": "mean effective dimension of the participants' probe embeddings",
    "gauge/global_effective_dim": "effective dimension of the global model's probe embeddings",
    "gauge/global_latent_std": "mean per-dimension std of the global model's probe embeddings",
    "gauge/drift_degenerate": "1 when some pair's full rotation was not identifiable (its angle not measured; the identified-subspace angle still is)",
    "gauge/distill_loss_before": "distillation loss before the coordinator's distillation",
    "gauge/distill_loss_after": "distillation loss after it",
    "gauge/distill_skipped": "1 when no consensus frame could be distilled",
}
#: Labels of the drift reports' per-participant fields; others are shown under their own name.
DRIFT_FIELDS = {"subspace_angle_deg": "angle in the 95 %-energy subspace (°)",
                "rotation_share": "share a rotation explains",
                "relative_residual_before": "relative disagreement before alignment",
                "fit_residual": "rotation fit residual",
                "subspace_tilt_deg": "tilt of the 95 %-energy subspace (°)",
                "subspace_rank": "rank of the 95 %-energy subspace",
                "angle_deg": "full-space geodesic angle (°)", "residual": "‖Q − I‖_F"}
#: How to read the full-space angle, under the drift table (docs/gauge.md, "Variance-weighted misalignment").
FULL_ANGLE_NOTE = (
    "How to read the columns: the angle within the 95 %-energy subspace and the share a rotation explains weight "
    "each latent direction by the energy the global model's probe embeddings put in it; they are the drift that "
    "matters for averaging, and the answer above leads with them. The full-space geodesic angle (and ‖Q − I‖_F) "
    "measures the whole Procrustes rotation over all latent directions, the near-empty ones too, which it turns "
    "freely to fit noise: it adds the angles of up to d/2 rotation planes, so it passes 180°, grows with the latent "
    "dimension and with each round's noise, and two embeddings identical in their strong directions read about "
    "530° at d = 64 (docs/gauge.md). Read it only for trends within one run, never as how far the frames turned.")
LOSS_KEYS = {"loss/pred": "prediction loss", "loss/sigreg": "SIGReg loss", "loss/anchor": "frame-anchor loss"}



# ================================================================================== run data
def load_drift(run_dir: str | Path, rounds: int) -> dict[int, dict]:
    """``drift/round-XXXX.json`` per round (rounds whose frames were degenerate have none)."""
    out = {}
    for t in range(rounds):
        p = Path(run_dir) / "drift" / f"round-{t:04d}.json"
        if p.is_file():
            out[t] = json.loads(p.read_text())
    return out


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _keys(rounds: list[dict], prefix: str) -> list[str]:
    found = sorted({k for r in rounds for k, v in r.items() if k.startswith(prefix) and _is_num(v)})
    known = [k for k in (GAUGE_KEYS if prefix == "gauge/" else LOSS_KEYS) if k in found]
    return known + [k for k in found if k not in known]


def _participant_fields(drift: dict[int, dict]) -> list[str]:
    """Numeric fields of the drift reports' per-participant records (angle_deg, residual, ...)."""
    fields: list[str] = []
    for rep in drift.values():
        for rec in (rep.get("drift_from_global") or {}).values():
            for k, v in rec.items():
                if _is_num(v) and k not in fields:
                    fields.append(k)
    order = list(DRIFT_FIELDS)  # variance-weighted first, the full-space angle and ‖Q − I‖_F last
    return [f for f in order if f in fields] + [f for f in fields if f not in order]


def _participants(drift: dict[int, dict]) -> list[str]:
    return sorted({p for rep in drift.values() for p in (rep.get("drift_from_global") or {})})


# ================================================================================== figures
def _series(rounds: list[dict], key: str) -> list[tuple[int, float]]:
    return [(int(r.get("round", i)) + 1, float(r[key])) for i, r in enumerate(rounds) if _is_num(r.get(key))]


def _success_rows(evaluation: RunEvaluation | None, baselines: BaselineResult | None = None):
    if evaluation is None:
        return []
    rows = [(ARM_LABEL[a], r.n_successes, r.n_episodes, tuple(r.success_ci), COLOURS[a])
            for a, r in evaluation.reports.items()]
    for i, (a, r) in enumerate((baselines.reports if baselines else {}).items()):
        # a local model takes its participant's colour, as in the drift figures
        colour = COLOURS[TWIN] if a == TWIN else participant_colour(i)
        rows.append((a, r.n_successes, r.n_episodes, tuple(r.success_ci), colour))
    return rows


def _drift_panels(axes, rounds, drift, participants, fields) -> None:
    for ax, f in zip(axes, fields + ["effective_dim"], strict=False):
        series: dict[str, list] = {}
        styles: dict[str, dict] = {}
        if f == "effective_dim":
            for i, key in enumerate(participants + ["global"]):
                series[key] = [(t + 1, rep["effective_dim"].get(key)) for t, rep in sorted(drift.items())
                               if _is_num((rep.get("effective_dim") or {}).get(key))]
                styles[key] = {"color": participant_colour(i)}
            styles["global"] = {"color": COLOURS["global"], "lw": 2}
            lines_panel(ax, series, "effective dimension", "Effective dimension on the probe", styles=styles,
                        empty="no drift report")
            continue
        for i, p in enumerate(participants):
            series[f"{p} → global"] = [(t + 1, rep["drift_from_global"].get(p, {}).get(f))
                                       for t, rep in sorted(drift.items())]
            styles[f"{p} → global"] = {"color": participant_colour(i)}
        if f == "subspace_angle_deg":
            series["mean (gauge/drift_subspace_angle_deg)"] = _series(rounds, "gauge/drift_subspace_angle_deg")
            styles["mean (gauge/drift_subspace_angle_deg)"] = {"color": COLOURS["global"], "ls": "--"}
        if f == "angle_deg":
            series["mean (gauge/drift_angle_deg)"] = _series(rounds, "gauge/drift_angle_deg")
            series["global → warm start"] = _series(rounds, "gauge/angle_to_warmstart_deg")
            styles["mean (gauge/drift_angle_deg)"] = {"color": COLOURS["global"], "ls": "--"}
            styles["global → warm start"] = {"color": COLOURS["warmstart"], "lw": 2}
        label = DRIFT_FIELDS.get(f, f)
        lines_panel(ax, series, label, f"Frame drift per round: {label}", styles=styles, empty="no drift report")


def write_run_figures(run_dir: Path, cfg: LensembleConfig, summary: dict, drift: dict[int, dict],
                      evaluation: RunEvaluation | None, baselines: BaselineResult | None = None) -> list[str]:
    """Every figure of the run report into ``<run>/figures/``; returns their relative paths."""
    plt = pyplot()
    fig_dir = run_dir / FIG_DIR
    rounds = summary.get("rounds") or []
    h = cfg.federation.inner_steps
    participants, fields = _participants(drift), _participant_fields(drift)
    per_round_bytes = [(t, int(b)) for t, b in _series(rounds, "fed/comm_bytes")]
    n_eval = evaluation.episodes if evaluation else 0

    # overview: the one figure the README shows
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6))
    success_panel(axes[0, 0], _success_rows(evaluation, baselines), f"Planning success, {n_eval} held-out episodes")
    # the drift panel leads with the variance-weighted angle, as the answer does
    _drift_panels([axes[0, 1]], rounds, drift, participants, fields[:1])
    lines_panel(axes[1, 0], {LOSS_KEYS.get(k, k): _series(rounds, k) for k in _keys(rounds, "loss/")},
                "loss (mean over participants)", "Losses per round")
    bytes_panel(axes[1, 1], per_round_bytes, h, "Bytes per round vs per-step synchronisation")
    fig.suptitle(f"lensemble run `{cfg.name}`: {summary.get('rounds_completed', 0)} rounds, "
                 f"{cfg.data.num_silos} participants", fontsize=11)
    save_figure(fig, fig_dir / "overview.png", dpi=80)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    success_panel(ax, _success_rows(evaluation, baselines),
                  f"Planning success, {n_eval} held-out episodes (same tasks)")
    save_figure(fig, fig_dir / "success.png")

    panels = fields + ["effective_dim"]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
    _drift_panels(list(axes.flat), rounds, drift, participants, fields)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    save_figure(fig, fig_dir / "drift.png")

    gauge = _keys(rounds, "gauge/")
    ncols = max(1, min(4, len(gauge)))
    nrows = max(1, math.ceil(len(gauge) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, gauge, strict=False):
        lines_panel(ax, {key: _series(rounds, key)}, "", key)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if not gauge:
        empty_panel(axes[0, 0], "no gauge/* metric recorded")
    for ax in list(axes.flat)[max(1, len(gauge)):]:
        ax.set_visible(False)
    save_figure(fig, fig_dir / "gauge.png")

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    lines_panel(ax, {LOSS_KEYS.get(k, k): _series(rounds, k) for k in _keys(rounds, "loss/")},
                "loss (mean over participants)", "Losses per round")
    save_figure(fig, fig_dir / "losses.png")

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    bytes_panel(ax, per_round_bytes, h, "Bytes per round vs per-step synchronisation")
    save_figure(fig, fig_dir / "communication.png")
    return [f"{FIG_DIR}/{name}" for name in FIGURES]


# ================================================================================== markdown
def fmt(x, spec: str = ".4g") -> str:
    """A table cell: an int as is, another number in ``spec``, or "–"."""
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return format(float(x), spec) if _is_num(x) else "–"


def pct1(x: float) -> str:
    """A rate in percent with one decimal: 0.3 -> "30.0"."""
    return f"{100 * x:.1f}"


def goal_text(goal_source: str, goal_offset: int) -> str:
    """How the tasks' goals were posed, in words (docs/evaluation.md)."""
    if goal_source == "dataset":
        return (f"{goal_offset} steps later in a held-out episode of the behaviour policy "
                "(dataset-goal protocol)")
    return f"{goal_offset} expert steps ahead (strict protocol)"


def success_table(reports: Mapping[str, EvalReport], labels: Mapping[str, str]) -> list[str]:
    """Markdown rows: one per model, successes, rate with its 95 % Wilson interval."""
    lines = ["| model | successes | success rate [95 % Wilson] | ms per action | planner | checkpoint | "
             "successes on a valid route |", "|---|---|---|---|---|---|---|"]
    for arm, r in reports.items():
        lo, hi = r.success_ci
        valid = getattr(r, "n_route_valid_successes", None)
        lines.append(f"| {labels.get(arm, arm)} | {r.n_successes}/{r.n_episodes} | {pct1(r.success_rate)} % "
                     f"[{pct1(lo)}, {pct1(hi)}] | {r.time_per_action_ms:.1f} | {r.planner_label} | "
                     f"`{r.checkpoint_hash[:12]}…` | {'–' if valid is None else f'{valid}/{r.n_episodes}'} |")
    return lines


#: The interval a comparison used, in the report's words.
INTERVAL_TEXT = {"newcombe-paired": "paired", "newcombe-hybrid-score": "unpaired"}


def comparison_rows(pairs, reports: Mapping[str, EvalReport], labels: Mapping[str, str]) -> list[str]:
    """Markdown rows: per pair (a, b), a − b in points with its 95 % Newcombe interval and the reading.

    The interval is paired over the tasks when both reports recorded their episodes on the same
    tasks (:func:`~lensemble.report.answer.paired_outcomes`), unpaired otherwise; the header says
    which, and a table mixing the two marks each row.
    """
    comps = []
    for a, b in pairs:
        ra, rb = reports[a], reports[b]
        comps.append((a, b, compare_success(a, ra.n_successes, ra.n_episodes, b, rb.n_successes, rb.n_episodes,
                                            outcomes=paired_outcomes(ra, rb))))
    kinds = sorted({INTERVAL_TEXT[c.interval] for _, _, c in comps})
    lines = [f"| comparison | difference [95 % Newcombe, {' or '.join(kinds)}] | reading |", "|---|---|---|"]
    for a, b, c in comps:
        reading = {"better": "better", "worse": "worse",
                   "indistinguishable": "not distinguishable at this n"}[c.reading]
        mark = f" ({INTERVAL_TEXT[c.interval]})" if len(kinds) > 1 else ""
        lines.append(f"| {labels.get(a, a)} − {labels.get(b, b)} | {100 * c.difference:+.1f} points "
                     f"[{100 * c.ci[0]:+.1f}, {100 * c.ci[1]:+.1f}]{mark} | {reading} |")
    return lines


def answer_lines(cfg: LensembleConfig, summary: dict, evaluation: RunEvaluation | None,
                 baselines: BaselineResult | None = None) -> list[str]:
    """The plain-language answer: success against the floors (and, with the baselines, gap
    recovery ρ in the same line), drift, communication."""
    rounds = summary.get("rounds") or []
    if evaluation is None:
        first = ("Planning success was not measured (--no-eval); `lensemble run` without --no-eval "
                 "evaluates the committed rounds without retraining.")
    else:
        reports = evaluation.reports
        counts = {ARM_TEXT[a]: (r.n_successes, r.n_episodes) for a, r in reports.items()}
        outcomes = {}  # per-episode successes of the arms that pair with the federated model's tasks
        for floor in ("random", "warmstart"):
            pair = paired_outcomes(reports["federated"], reports[floor])
            if pair is not None:
                outcomes[ARM_TEXT["federated"]], outcomes[ARM_TEXT[floor]] = pair
        first = success_sentence(ARM_TEXT["federated"], counts, [ARM_TEXT["random"], ARM_TEXT["warmstart"]],
                                 outcomes)
        if baselines is not None:
            twin = baselines.twin
            first += " " + gap_sentence(baselines.gap, [r.success_rate for r in baselines.locals],
                                        (twin.n_successes, twin.n_episodes), why=baselines.gap_error)
    # [stability] a run that came apart says so in its first line, with the numbers
    watch = stability_sentence(summary.get("stability"))
    first = f"{first} {watch}" if watch else first
    return [first, drift_sentence(rounds), communication_sentence(rounds, cfg.federation.inner_steps)]


def _interval(x: float | None, ci, spec: str, scale: float = 1.0) -> str:
    if x is None:
        return "–"
    return f"{format(scale * x, spec)} [{format(scale * ci[0], spec)}, {format(scale * ci[1], spec)}]"


def baselines_markdown(cfg: LensembleConfig, summary: dict, baselines: BaselineResult) -> list[str]:
    """The report's section on the baselines: their budget, training time and ρ with its intervals."""
    rounds, h = int(summary.get("rounds_completed") or 0), cfg.federation.inner_steps
    c, b = cfg.data.num_silos, cfg.train.batch_size
    lines = ["## What federation recovered: the baselines (`--baselines`)", "",
             f"From the warm start the federation started from, at the federation's budget: each local model "
             f"trained on its silo alone for its participant's {rounds} × H = {rounds * h} steps at {b} clips per "
             f"step; the data-parallel twin trained the federation's {rounds * h} sequential steps at C × B = "
             f"{c * b} clips per step on the silos' data pooled. Their rows are in the success table above (same "
             "tasks, same goal-spec hash).", "",
             "| model | data | steps | clips per step | training wall time | checkpoint |", "|---|---|---|---|---|---|"]
    for arm in baseline_arms(cfg):
        t = baselines.trained[arm]
        took = format_duration(t.seconds) + (" (reused)" if t.reused else "")  # the recorded time either way
        lines.append(f"| {arm_label(arm)} | {source_of(arm)} | {t.steps} | {t.batch_size} | {took} | "
                     f"`{t.checkpoint_hash[:12]}…` |")
    g = baselines.gap
    lines += ["", "| quantity | estimate [95 %] |", "|---|---|"]
    if g is None:
        lines += [f"| ρ | not computed: {baselines.gap_error} |", ""]
        return lines
    rho = _interval(g.rho, g.rho_ci, ".2f") if g.defined else f"undefined: {g.reason}"
    lines += [f"| S_fed − S_local (points) | {_interval(g.numerator, g.numerator_ci, '+.1f', 100)} |",
              f"| S_twin − S_local (points) | {_interval(g.denominator, g.denominator_ci, '+.1f', 100)} |",
              f"| ρ = (S_fed − S_local) / (S_twin − S_local) | {rho} |", "",
              f"The intervals are a paired bootstrap over the {g.n_seeds} tasks ({g.n_boot} replicates, "
              f"percentile, generator seed {g.seed}): each replicate resamples the tasks once for all three arms, "
              f"and S_local on a task is the mean success of the {c} local models there. A run is one seed, so "
              "they say how sure these tasks make ρ for these models, not how ρ varies between training seeds "
              "(`lensemble study` bootstraps over seeds). ρ is undefined when the interval of S_twin − S_local "
              "contains 0: there is no measured gap to recover.", ""]
    return lines


def render_run_markdown(cfg: LensembleConfig, summary: dict, drift: dict[int, dict],
                        evaluation: RunEvaluation | None, figures: list[str], *, engine: str | None = None,
                        baselines: BaselineResult | None = None) -> str:
    rounds = summary.get("rounds") or []
    n_rounds = int(summary.get("rounds_completed") or 0)
    h = cfg.federation.inner_steps
    lines = [f"# Run `{cfg.name}`: {n_rounds} DiLoCo rounds, {cfg.data.num_silos} participants", ""]
    lines += ["## The answer", ""] + [f"- {s}" for s in answer_lines(cfg, summary, evaluation, baselines)] + [""]
    lines += [f"![Overview: success, drift, losses, bytes]({FIG_DIR}/overview.png)", ""]

    lines += ["## Planning success", ""]
    if evaluation is None:
        lines += ["Not evaluated (`--no-eval`).", ""]
    else:
        ev = cfg.eval
        lines += [f"Closed-loop latent MPC on {evaluation.episodes} held-out {cfg.env.id} episodes "
                  f"({ev.planner.upper()} {ev.num_samples} × {ev.iterations}, horizon {ev.horizon}, goal "
                  f"{goal_text(ev.goal_source, ev.goal_offset)}, budget {ev.budget} env steps, eval seed {ev.seed}). "
                  f"Every model ran the same tasks: goal-spec hash `{evaluation.goal_spec_hash[:16]}…`. "
                  "Success is the environment's own test.", ""]
        extra = baselines.reports if baselines else {}
        lines += success_table({**evaluation.reports, **extra},
                               {**ARM_LABEL, **{a: arm_label(a) for a in extra}}) + [""]
        lines += comparison_rows([("federated", "random"), ("federated", "warmstart"), ("warmstart", "random")],
                                 evaluation.reports, ARM_LABEL) + [""]
        lines += ["A difference is read as better or worse only when its 95 % interval (Newcombe's, from the "
                  "two Wilson intervals) excludes 0; otherwise it is not distinguishable at this n. Where both "
                  "models' per-episode outcomes are recorded the interval is paired over the tasks (Newcombe 1998, "
                  "method 10: it uses how the two models' outcomes on a task correlate); otherwise it treats the "
                  "episodes of two models as independent, which is conservative for the same tasks. Success is "
                  "the environment's flag; the last column counts the successes whose every step crossed the wall "
                  "only through a door (docs/evaluation.md).", "",
                  f"![Success with 95 % Wilson intervals]({FIG_DIR}/success.png)", ""]
        lines += ["EvalReports: " + ", ".join(f"`{EVAL_DIR}/{a}.json`" for a in {**evaluation.reports, **extra}), ""]
        if baselines is not None:
            lines += baselines_markdown(cfg, summary, baselines)

    lines += ["## Frame drift per round", ""]
    participants, fields = _participants(drift), _participant_fields(drift)
    if drift:
        lines += ["From `drift/round-XXXX.json`: each participant's frame against the global model's after "
                  "the round, on the public probe's measurement frames (Procrustes rotation Q).", ""]
        head = ["round", "who", *fields, "effective dim"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for t, rep in sorted(drift.items()):
            for p in participants:
                rec = (rep.get("drift_from_global") or {}).get(p, {})
                vals = [fmt(rec.get(f), ".2f") for f in fields]
                lines.append(f"| {t + 1} | {p} → global | " + " | ".join(vals)
                             + f" | {fmt((rep.get('effective_dim') or {}).get(p), '.2f')} |")
            r = next((x for x in rounds if int(x.get("round", -1)) == t), {})
            glob = ["–"] * len(fields)
            if "angle_deg" in fields:
                glob[fields.index("angle_deg")] = fmt(r.get("gauge/angle_to_warmstart_deg"), ".2f")
            lines.append(f"| {t + 1} | global → warm start | " + " | ".join(glob)
                         + f" | {fmt((rep.get('effective_dim') or {}).get('global'), '.2f')} |")
        lines += ["", FULL_ANGLE_NOTE, ""]
    else:
        lines += ["No round had identifiable frames (degenerate probe embeddings); no drift report.", ""]
    lines += [f"![Frame drift per round]({FIG_DIR}/drift.png)", ""]

    gauge = _keys(rounds, "gauge/")
    lines += ["## Every gauge measure the run recorded", "",
              "Per round, from `summary.json` (the same numbers as `metrics.jsonl`).", ""]
    if gauge:
        head = ["key", "meaning", *[f"round {int(r.get('round', i)) + 1}" for i, r in enumerate(rounds)]]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in gauge:
            lines.append(f"| `{k}` | {GAUGE_KEYS.get(k, '')} | " + " | ".join(fmt(r.get(k)) for r in rounds) + " |")
        lines += ["", f"![Every gauge/* key per round]({FIG_DIR}/gauge.png)", ""]
    else:
        lines += ["No gauge/* metric recorded.", ""]

    losses = _keys(rounds, "loss/")
    lines += ["## Losses per round", "", "Mean over the participants that replied, last inner step of the round.", ""]
    lines += ["| round | " + " | ".join(f"`{k}`" for k in losses) + " |", "|---|" + "---|" * len(losses)]
    for i, r in enumerate(rounds):
        lines.append(f"| {int(r.get('round', i)) + 1} | " + " | ".join(fmt(r.get(k)) for k in losses) + " |")
    lines += ["", f"![Losses per round]({FIG_DIR}/losses.png)", ""]

    lines += ["## Communication", "",
              f"`fed/comm_bytes` per round as the engine counts it, against per-step synchronisation, which "
              f"would exchange the same update after each of the H = {h} inner steps (H × the round's bytes).", "",
              "| round | bytes (fed/comm_bytes) | per-step synchronisation (bytes) | round seconds |", "|---|---|---|---|"]
    for i, r in enumerate(rounds):
        b = r.get("fed/comm_bytes")
        lines.append(f"| {int(r.get('round', i)) + 1} | {int(b) if _is_num(b) else '–'} | "
                     f"{h * int(b) if _is_num(b) else '–'} | {fmt(r.get('fed/round_seconds'), '.1f')} |")
    total = sum(int(r["fed/comm_bytes"]) for r in rounds if _is_num(r.get("fed/comm_bytes")))
    lines += ["", f"In all: {format_bytes(total)} on the wire; per-step synchronisation: {format_bytes(h * total)}.",
              "", f"![Bytes per round]({FIG_DIR}/communication.png)", ""]

    lines += ["## How to read this", "",
              "- **Success** is the number that matters. A good run plans better than random actions (the "
              "difference interval above 0) and not worse than the warm start; a run not distinguishable "
              "from random actions has shown nothing a planner can use."
              + (f" With {evaluation.episodes} episodes per model, two rates near 25 % are told apart only "
                 f"when they differ by about {100 * smallest_resolvable_difference(evaluation.episodes):.0f} "
                 "points or more (the unpaired bound; the paired interval resolves smaller differences when the "
                 "models' outcomes on a task correlate); `--eval-episodes` with a larger N narrows the intervals."
                 if evaluation else ""),
              "- **Frame drift** says how far the participants' latent frames rotate away from the global "
              "model's, read within the global model's 95 %-energy subspace (where the embeddings carry their "
              "signal) and as the share of their disagreement a rotation explains. It does not by itself decide "
              "success (in the CPU study naive runs drifted 95–168° and anchored ones 31–34° in the full-space "
              "angle, and no gauge-controlled rung planned better than naive), but a subspace angle that keeps "
              "growing round after round, or an effective dimension falling towards 1, are the signs of a "
              "federation coming apart.",
              "- **Communication**: DiLoCo exchanges one update per round; per-step synchronisation would "
              f"exchange H = {h} times as much.", ""]

    lines += ["## Provenance", "", "| what | value |", "|---|---|"]
    rows = [("config hash", summary.get("config_hash")), ("final checkpoint hash", summary.get("final_hash")),
            ("warm-start hash", summary.get("warmstart_hash")), ("probe hash", summary.get("probe_hash")),
            ("engine", engine), ("rounds completed", n_rounds), ("inner steps H", h)]
    lines += [f"| {k} | `{v}` |" for k, v in rows if v is not None]
    lines += ["", "Files: `summary.json`, `metrics.jsonl`, `drift/`, `rounds/`, `manifest.json`"
              + (f", `{EVAL_DIR}/`" if evaluation else "") + ".", ""]
    return "\n".join(lines)


# ================================================================================== writing
@dataclass(frozen=True)
class RunReport:
    """Where a run report went and what it says."""

    markdown: Path
    html: Path
    figures: tuple[Path, ...]
    lines: tuple[str, ...]


def write_run_report(run_dir: str | Path, cfg: LensembleConfig, evaluation: RunEvaluation | None = None, *,
                     engine: str | None = None, baselines: BaselineResult | None = None) -> RunReport:
    """Figures, ``report.md`` and ``report.html`` for a finished run, and the evaluation's numbers
    in ``summary.json`` (:func:`~lensemble.report.run_summary.write_evaluation_summary`); returns a
    :class:`RunReport`.

    ``evaluation`` comes from :func:`evaluate_run`; None reports a run without planning success.
    ``baselines`` (from :func:`lensemble.report.baselines.run_baselines`) adds their rows and ρ.
    """
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    drift = load_drift(run_dir, int(summary.get("rounds_completed") or 0))
    figures = write_run_figures(run_dir, cfg, summary, drift, evaluation, baselines)
    md = render_run_markdown(cfg, summary, drift, evaluation, figures, engine=engine, baselines=baselines)
    atomic_write(run_dir / "report.md", md)
    atomic_write(run_dir / "report.html", render_html(md, f"Run {cfg.name}"))
    write_evaluation_summary(run_dir, cfg, evaluation, baselines)
    return RunReport(run_dir / "report.md", run_dir / "report.html",
                     tuple(run_dir / f for f in figures), tuple(answer_lines(cfg, summary, evaluation, baselines)))


__all__ = ["ARMS", "ARM_LABEL", "ARM_TEXT", "EVAL_DIR", "FIGURES", "RunEvaluation", "RunReport", "answer_lines",
           "evaluate_run", "load_run_evaluation", "write_run_report"]
