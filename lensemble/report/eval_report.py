"""The report of one ``lensemble evaluate``: success with its interval, the ladder, one figure.

:func:`eval_report_paths` says where it goes: beside the ``--out`` JSON (``x.json`` -> ``x.md``,
``x.html``, ``x-figures/success.png``), else in the checkpoint's run folder under
``evaluations/<checkpoint label>-<policy>-<split>-seed<seed>/`` (``report.md``, ``report.html``, ``eval.json``,
``figures/success.png``), so it never overwrites a run's own ``report.md``. Every file goes
through ``guard_export``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lensemble.eval.reports import EvalReport, cross_wall_summary
from lensemble.report.answer import rate_text
from lensemble.report.figures import COLOURS, pyplot, save_figure, success_panel
from lensemble.report.run_report import fmt, success_table
from lensemble.study.files import atomic_write
from lensemble.study.report import render_html

#: Files that mark a run folder (the coordinator's and train_local's outputs).
RUN_MARKERS = ("summary.json", "manifest.json", "result.json")


@dataclass(frozen=True)
class EvalReportPaths:
    """Where the JSON, the Markdown, the HTML and the figure of one evaluation go."""

    json: Path
    markdown: Path
    html: Path
    figure: Path


def run_folder_of(checkpoint: str | Path) -> Path:
    """The nearest folder above ``checkpoint`` that holds a run's summary/manifest/result, else
    the checkpoint's parent."""
    ck = Path(checkpoint).resolve()
    for folder in ck.parents:
        if any((folder / m).is_file() for m in RUN_MARKERS):
            return folder
    return ck.parent


def checkpoint_label(checkpoint: str | Path) -> str:
    """``runs/x/rounds/round-0002/model`` -> ``round-0002``; ``.../checkpoints/step-000300`` -> ``step-000300``."""
    ck = Path(checkpoint).resolve()
    return ck.parent.name if ck.name == "model" else ck.name


def eval_report_paths(checkpoint: str | Path, out: str | Path | None, *, policy: str = "mpc",
                      split: str = "heldout", seed: int | None = None) -> EvalReportPaths:
    """See the module docstring. ``seed`` (the evaluation's ``eval.seed``) names the folder too, so
    evaluations of one checkpoint with different seeds keep their own reports (issue 33)."""
    if out:
        out = Path(out)
        return EvalReportPaths(out, out.with_suffix(".md"), out.with_suffix(".html"),
                               out.parent / f"{out.stem}-figures" / "success.png")
    tail = f"-seed{seed}" if seed is not None else ""
    folder = run_folder_of(checkpoint) / "evaluations" / f"{checkpoint_label(checkpoint)}-{policy}-{split}{tail}"
    return EvalReportPaths(folder / "eval.json", folder / "report.md", folder / "report.html",
                           folder / "figures" / "success.png")


def render_eval_markdown(report: EvalReport, checkpoint: str | Path, *, split: str, figure: str,
                         json_name: str) -> str:
    label = "random actions" if report.planner == "random" else f"`{checkpoint_label(checkpoint)}`"
    lines = [f"# Evaluation of {label} on {report.env_id} ({split})", "",
             f"Success {rate_text(report.n_successes, report.n_episodes)} (95 % Wilson), on tasks with goal-spec "
             f"hash `{report.goal_spec_hash[:16]}…`: another model evaluated on the same hash ran the same "
             "episodes. Success is the environment's own test.", "",
             "Goal protocol: " + ("dataset-goal (start and goal from a held-out behaviour-policy episode)"
                                  if report.goal_source == "dataset" else "strict (goal expert)")
             + " (docs/evaluation.md).", ""]
    fit = report.planning_cost
    if fit and fit.get("cost") == "reachability":
        lines += [f"Planner energy: a reachability head fitted on the {fit['source']} trajectories' latents "
                  f"({fit['episodes']} episodes, gaps up to {fit['max_gap']} env steps, {fit['aggregate']} "
                  f"aggregate; held-out rank correlation with the true gap {fit['holdout_spearman']:.2f}) "
                  "instead of the L1 latent distance (docs/model.md).", ""]
    cross = cross_wall_summary(report)
    if cross is not None:
        on = ("none of them" if cross["success_rate"] is None
              else f"success on them {rate_text(cross['successes'], cross['tasks'])}")
        lines += [f"Tasks whose goal lies across the wall: {cross['tasks']}/{report.n_episodes} "
                  f"({100 * cross['share']:.0f} %); {on}.", ""]
    lines += success_table({"model": report}, {"model": label}) + ["", f"![Success]({figure})", ""]
    ladder = [(name, getattr(report, name)) for name in
              ("one_step_error", "copy_last_error", "train_one_step_error", "train_copy_last_error",
               "rollout_composite", "intervention_error", "probe_r2", "pixel_pca_r2", "effective_dim", "latent_std",
               "transfer_success_rate")]
    ladder = [(n, v) for n, v in ladder if v is not None]
    if ladder or report.rollout_error:
        lines += ["## The evaluation ladder", "", "| measure | value |", "|---|---|"]
        lines += [f"| {n.replace('_', ' ')} | {fmt(v)} |" for n, v in ladder]
        if report.rollout_error:
            lines.append("| rollout error | " + ", ".join(f"h={h}: {fmt(e, '.3g')}"
                                                         for h, e in sorted(report.rollout_error.items())) + " |")
        lines += ["", "A one-step error above the copy-last error means the predictor learnt nothing useful "
                  "on held-out episodes; if its training-episode pair (train one-step / train copy-last) "
                  "is well below 1, it fitted its training episodes instead (docs/evaluation.md).", ""]
    lines += ["## Provenance", "", "| what | value |", "|---|---|",
              f"| checkpoint | `{checkpoint}` |", f"| checkpoint hash | `{report.checkpoint_hash}` |",
              f"| config hash | `{report.config_hash}` |", f"| planner | {report.planner_label} |",
              f"| goal source | {report.goal_source} |",
              f"| planning samples per plan | {report.planning_samples} |", f"| eval seed | {report.seed} |",
              f"| EvalReport | `{json_name}` |", ""]
    return "\n".join(lines)


def write_eval_report(report: EvalReport, checkpoint: str | Path, paths: EvalReportPaths, *,
                      split: str = "heldout") -> EvalReportPaths:
    """Write the EvalReport JSON, the figure, the Markdown and the HTML; return the paths."""
    report.write(paths.json)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3.6))
    colour = COLOURS["random"] if report.planner == "random" else COLOURS["federated"]
    success_panel(ax, [(checkpoint_label(checkpoint), report.n_successes, report.n_episodes,
                        tuple(report.success_ci), colour)], f"{report.n_episodes} episodes ({split})")
    save_figure(fig, paths.figure)
    rel = paths.figure.relative_to(paths.markdown.parent).as_posix()
    md = render_eval_markdown(report, checkpoint, split=split, figure=rel, json_name=paths.json.name)
    atomic_write(paths.markdown, md)
    atomic_write(paths.html, render_html(md, f"Evaluation {checkpoint_label(checkpoint)}"))
    return paths


__all__ = ["EvalReportPaths", "eval_report_paths", "write_eval_report"]
