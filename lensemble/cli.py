"""The ``lensemble`` command. Every command takes Hydra overrides as trailing arguments, e.g.

    lensemble data collect experiment=micro data.num_silos=3

This module only converts command-line arguments into calls of the library and prints the
results; the work happens in the library (``evaluate``, ``run_study`` ...). Imports of the library
sit inside the commands so that ``lensemble --help`` starts fast. :func:`cli_evaluate`,
:func:`study_command` and :func:`parse_seeds` are the plain-function forms of ``evaluate`` and
``study`` (tests and scripts call them).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Sequence

import typer
from rich.console import Console

from lensemble.errors import ConfigError, LensembleError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Federated JEPA world models, honestly evaluated.")
data_app = typer.Typer(no_args_is_help=True, help="Collect environment data into silos and a public probe.")
app.add_typer(data_app, name="data")
console = Console(stderr=True)

OVERRIDES = typer.Argument(None, help="Hydra overrides, e.g. gauge=anchor federation.rounds=5")


def _load(overrides):
    from lensemble.config import load_config

    return load_config(list(overrides or []))


def _fail(exc: LensembleError):
    from rich.markup import escape

    console.print(f"[bold red]error[/] {escape(str(exc))}")
    raise typer.Exit(code=2)


@app.command("config")
def show_config(overrides: list[str] = OVERRIDES):
    """Print the composed, validated config as JSON (and its hash).

    Runs the cross-field checks ``run`` makes before any work (silo count against the partition
    factor's values, the factor's name, rungs that privacy rules out), so "validated" means it.
    """
    from lensemble.data.partition import check_partition_config
    from lensemble.federation.checks import check_federation_config

    try:
        cfg = _load(overrides)
        check_partition_config(cfg)
        check_federation_config(cfg)
    except LensembleError as exc:
        _fail(exc)
    print(json.dumps(cfg.model_dump(mode="json"), indent=1))
    console.print(f"config_hash {cfg.config_hash()}")


@data_app.command("collect")
def data_collect(overrides: list[str] = OVERRIDES):
    """Collect every silo, the held-out splits, the public corpus and the probe (with progress)."""
    from lensemble.data.store import ensure_data

    try:
        cfg = _load(overrides)
        folder, summary = ensure_data(cfg, progress=True)
    except LensembleError as exc:
        _fail(exc)
    console.print(f"data in [bold]{folder}[/] · probe {summary['probe']['content_hash'][:16]}… · "
                  f"{summary.get('frames_per_second', 'cached')} frames/s")
    for silo in summary["silos"]:
        console.print(f"  silo {silo['silo']}: {silo['train']['episodes']} train episodes, factor values "
                      f"{len(silo['values'])}")


@app.command("train")
def train(source: str = typer.Option("pooled", help="pooled | silo-<i> | public"),
          overrides: list[str] = OVERRIDES):
    """Train one world model on one dataset (centralized or local-only baseline)."""
    from lensemble.training.trainer import train_local

    try:
        res = train_local(_load(overrides), source=source)
    except LensembleError as exc:
        _fail(exc)
    console.print(f"checkpoint [bold]{res.checkpoint_dir}[/] hash {res.checkpoint_hash}")
    console.print({k: round(v, 4) for k, v in res.final_metrics.items()})


@app.command("warmstart")
def warmstart(overrides: list[str] = OVERRIDES):
    """Train the public warm start (public corpus only) and print its pinned hash."""
    from lensemble.training.warmstart import train_warmstart

    try:
        res = train_warmstart(_load(overrides))
    except LensembleError as exc:
        _fail(exc)
    console.print(f"warm start [bold]{res.checkpoint_dir}[/] hash {res.checkpoint_hash}")


VERBOSE = typer.Option(False, "--verbose", help="also show DEBUG lines, deprecation banners and library warnings")


def _console(verbose: bool) -> None:
    from lensemble.observability.console import configure_console

    configure_console(verbose)


def _closing(lines: Sequence[str]) -> None:
    # Plain print, unwrapped: the closing answer must read the same in a terminal and in a log.
    sys.stderr.flush()
    for line in lines:
        print(line, flush=True)


@app.command("run")
def run(engine: str = typer.Option("ray", help="ray (Flower simulation engine) | flower-inprocess | inprocess"),
        eval_episodes: int = typer.Option(None, "--eval-episodes",
                                          help="closed-loop episodes per model after the rounds (default: eval.episodes)"),
        evaluate: bool = typer.Option(True, "--eval/--no-eval",
                                      help="evaluate the final model, the warm start and random actions"),
        baselines: bool = typer.Option(False, "--baselines",
                                       help="also train each silo's local model and the data-parallel twin from the "
                                            "warm start at the federation's budget, score them on the same tasks and "
                                            "report gap recovery rho (docs/evaluation.md)"),
        verbose: bool = VERBOSE,
        # [cluster] placement options (engine ray): not part of the config, so not of its hash
        ray_address: str = typer.Option(None, "--ray-address",
                                        help="run the virtual clients on this running Ray cluster (its head's "
                                             "host:port, or auto); default: a private Ray (docs/federation.md)"),
        client_cpus: int = typer.Option(1, "--client-cpus", help="Ray CPUs per virtual client (engine ray)"),
        client_gpus: float = typer.Option(0.0, "--client-gpus",
                                          help="Ray GPUs per virtual client (engine ray; 1: one GPU per participant)"),
        overrides: list[str] = OVERRIDES):
    """Run a federated DiLoCo training (resumes a run folder that already holds rounds), evaluate
    the final global model against the warm start and random actions (with --baselines also the
    local models and the data-parallel twin, and gap recovery rho), and write runs/<name>/report.md."""
    _console(verbose)
    from lensemble.federation.simulation import run_federated_simulation
    from lensemble.observability.progress import Heartbeat
    from lensemble.report.baselines import run_baselines
    from lensemble.report.run_report import evaluate_run, write_run_report
    from lensemble.report.watch import RoundWatch

    try:
        cfg = _load(overrides)
        placed = ray_address is not None or client_cpus != 1 or client_gpus != 0  # [cluster]
        if placed and engine != "ray":
            raise ConfigError("--ray-address, --client-cpus and --client-gpus place Ray's virtual clients",
                              remediation="use them with --engine ray")
        if baselines and not evaluate:  # refused before the rounds, not after them
            raise ConfigError("--baselines compares planning success, which --no-eval skips",
                              remediation="drop --no-eval or --baselines")
        with Heartbeat(RoundWatch(cfg, cfg.run_dir).status):
            if engine == "ray" and (verbose or placed):
                # run_federated_simulation has no verbose switch nor placement; the flwr-run engine
                # has both (verbose streams Flower's own lines, not only the ServerApp's).
                from lensemble.federation.flower.runtime import run_with_flwr

                summary = run_with_flwr(cfg, cfg.run_dir, verbose=verbose, ray_address=ray_address,
                                        client_cpus=client_cpus, client_gpus=client_gpus)
            else:
                summary = run_federated_simulation(cfg, cfg.run_dir, engine=engine)
        evaluation = evaluate_run(cfg.run_dir, cfg, eval_episodes) if evaluate else None
        extra = (run_baselines(cfg.run_dir, cfg, evaluation.reports["federated"], evaluation.episodes)
                 if baselines else None)
        report = write_run_report(cfg.run_dir, cfg, evaluation, engine=engine, baselines=extra)
    except LensembleError as exc:
        _fail(exc)
    final = summary.get("final_checkpoint")
    _closing([
        "",
        f"Run `{cfg.name}`: {summary['rounds_completed']} rounds, {cfg.data.num_silos} participants, engine {engine}; "
        f"final model {final} ({str(summary['final_hash'])[:12]}…).",
        *report.lines,
        f"Report: {report.markdown} (also {report.html.name}; figures in {report.markdown.parent / 'figures'}/).",
    ])


@app.command("evaluate")
def evaluate_cmd(checkpoint: str = typer.Argument(..., help="checkpoint folder"),
                 env: str = typer.Option("swm/TwoRoom-v1", help="environment id (swm/TwoRoom-v1, swm/PushT-v1, "
                                         "swm/ReacherDMControl-v0)"),
                 episodes: int = typer.Option(None, help="episodes (default: eval.episodes)"),
                 split: str = typer.Option("heldout", help="heldout | factor (transfer values)"),
                 policy: str = typer.Option("mpc", help="mpc | random (control) | oracle (the true dynamics: TwoRoom, PushT, Reacher)"),
                 ladder: bool = typer.Option(True, help="also run the evaluation ladder"),
                 allow_other_env: bool = typer.Option(False, help="evaluate on an environment other than "
                                                      "the one the checkpoint was trained on"),
                 out: str = typer.Option(None, help="write the EvalReport JSON here (the report goes beside it)"),
                 verbose: bool = VERBOSE,
                 overrides: list[str] = OVERRIDES):
    """Closed-loop latent-MPC success and the evaluation ladder for one checkpoint; writes a report
    (report.md/.html beside --out, else under the checkpoint's run folder in evaluations/)."""
    _console(verbose)
    try:
        report = cli_evaluate(checkpoint, env, episodes, split, policy, out, list(overrides or []), ladder=ladder,
                              allow_other_env=allow_other_env)
    except LensembleError as exc:
        _fail(exc)
    from lensemble.report.eval_report import eval_report_paths

    print(report.to_json())
    paths = eval_report_paths(checkpoint, out, policy=policy, split=split, seed=report.seed)
    _closing([f"Report: {paths.markdown} (also {paths.html.name}; EvalReport {paths.json})."])


@app.command("study")
def study(name: str = typer.Option("tiny", help="study name (results under <out>/<name>)"),
          preset: str = typer.Option(None, help="study preset in configs/study/ (default: the name)"),
          seeds: str = typer.Option(None, help="seeds, e.g. 0-5 or 0,2"),
          sweeps: str = typer.Option(None, help="sweeps to run, e.g. severity,participants or none"),
          out: str = typer.Option("docs/results", help="where summaries, registry and report go"),
          scratch: str = typer.Option(None, help="scratch folder for checkpoints (default runs/study/<name>)"),
          jobs: int = typer.Option(1, help="runs in parallel (one torch thread each)"),
          first: str = typer.Option(None, help="groups whose missing runs go first, e.g. severity,dp "
                                    "(order only: plan and registry unchanged)"),
          amend: str = typer.Option(None, help="reason for changing the registry after runs started"),
          plan_only: bool = typer.Option(False, help="write registry and plan, print the cost estimate"),
          report_only: bool = typer.Option(False, help="rebuild analysis and report from summaries"),
          progress: bool = typer.Option(True, help="show progress"),
          verbose: bool = VERBOSE,
          overrides: list[str] = OVERRIDES):
    """The ablation ladder, baselines and sweeps with a pre-registered analysis and a report."""
    _console(verbose)
    try:
        res = study_command(list(overrides or []), name=name, preset=preset, seeds=seeds, sweeps=sweeps,
                            out=out, scratch=scratch, progress=progress, amend=amend, plan_only=plan_only,
                            report_only=report_only, jobs=jobs, first=first)
    except LensembleError as exc:
        _fail(exc)
    console.print(f"planned {res.planned} · executed {res.executed} · skipped {res.skipped} · failed {len(res.failed)}")
    if res.report:
        report = Path(res.report)
        _closing([f"Report: {report} (also {report.with_suffix('.html').name}; figures in {report.parent / 'figures'}/)."])
    if res.failed:
        raise typer.Exit(code=1)


@app.command("drift")
def drift(checkpoints: list[str] = typer.Argument(..., help="checkpoint folders (one per participant)"),
          probe: str = typer.Option(..., help="the public probe file (.npz)"),
          probe_hash: str = typer.Option(None, help="expected probe hash (default: the checkpoints' own)"),
          out: str = typer.Option(None, help="write the FrameDriftReport JSON here"),
          singular_floor: float = typer.Option(1e-6, help="relative singular-value floor"),
          degenerate: str = typer.Option("raise", help="a pair whose full rotation is not identifiable: "
                                         "'raise' (an error) or 'mask' (its full angle None, its "
                                         "identified-subspace numbers kept; docs/gauge.md)")):
    """Frame drift between checkpoints on the pinned public probe."""
    from lensemble.data.residency import guard_export
    from lensemble.gauge.checkpoint_drift import drift_between_checkpoints

    try:
        report = drift_between_checkpoints(checkpoints, probe, expected_probe_hash=probe_hash,
                                           singular_floor=singular_floor, degenerate=degenerate)
    except LensembleError as exc:
        _fail(exc)
    text = report.model_dump_json(indent=1)
    if out:
        guard_export(out)  # a drift report is shipped out: never into a silo's folder
        Path(out).write_text(text)
    print(text)


# ================================================================================== adapters
def cli_evaluate(
    checkpoint: str,
    env: str = "swm/TwoRoom-v1",
    episodes: int | None = None,
    split: str = "heldout",
    policy: str = "mpc",
    out: str | None = None,
    overrides: Sequence[str] | None = None,
    *,
    ladder: bool = True,
    progress: bool = True,
    allow_other_env: bool = False,
):
    """``lensemble evaluate CKPT --env ... [--episodes N] [--split ...] [--policy ...] [--out f.json]
    [--allow-other-env]``.

    Composes the config from ``overrides``, runs ``evaluate``, prints a short table (stderr),
    writes the report JSON to ``out`` and the report (Markdown, HTML, one figure) beside it, or,
    without ``out``, both under the checkpoint's run folder
    (:func:`lensemble.report.eval_report.eval_report_paths`; never into a silo folder). Returns the
    ``EvalReport``. ``ladder=False`` skips the ladder (and the data collection it may need).
    """
    from rich.table import Table

    from lensemble.config import load_config
    from lensemble.eval.closed_loop import evaluate
    from lensemble.eval.reports import cross_wall_summary
    from lensemble.report.eval_report import eval_report_paths, write_eval_report

    cfg = load_config(list(overrides or []))
    report = evaluate(checkpoint, env, cfg=cfg, episodes=episodes, split=split, policy=policy, ladder=ladder,
                      progress=progress, allow_other_env=allow_other_env)
    table = Table(title=f"evaluate {Path(checkpoint).name} on {env} ({split}, {policy})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    lo, hi = report.success_ci
    table.add_row("success", f"{report.n_successes}/{report.n_episodes} = {report.success_rate:.1%} "
                             f"[{lo:.1%}, {hi:.1%}]")
    table.add_row("goal source", report.goal_source)
    cross = cross_wall_summary(report)
    if cross is not None:
        rate = "-" if cross["success_rate"] is None else f"{cross['successes']}/{cross['tasks']} = {cross['success_rate']:.1%}"
        table.add_row("cross-wall tasks", f"{cross['tasks']}/{report.n_episodes} = {cross['share']:.1%}")
        table.add_row("success on cross-wall tasks", rate)
    table.add_row("time per action", f"{report.time_per_action_ms:.1f} ms ({report.planner_label})")
    table.add_row("planning samples / plan", str(report.planning_samples))
    for name in ("transfer_success_rate", "one_step_error", "copy_last_error", "train_one_step_error",
                 "train_copy_last_error", "rollout_composite", "intervention_error", "probe_r2", "pixel_pca_r2",
                 "effective_dim", "latent_std"):
        value = getattr(report, name)
        if value is not None:
            table.add_row(name.replace("_", " "), f"{value:.4g}")
    if report.rollout_error:
        table.add_row("rollout error", ", ".join(f"h={h}: {e:.3g}" for h, e in sorted(report.rollout_error.items())))
    console.print(table)
    write_eval_report(report, checkpoint, eval_report_paths(checkpoint, out, policy=policy, split=split,
                                                            seed=report.seed), split=split)
    return report


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-5"`` (inclusive) or a mix, e.g. ``"0-2,7"`` -> a list of ints."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        try:
            seeds += list(range(int(m.group(1)), int(m.group(2)) + 1)) if m else [int(part)]
        except ValueError:
            raise ConfigError(f"cannot read seeds {text!r}", remediation="write e.g. 0,1,2 or 0-5") from None
    if not seeds:
        raise ConfigError(f"no seeds in {text!r}", remediation="write e.g. 0,1,2 or 0-5")
    return seeds


def study_command(
    overrides: Sequence[str] | None = None,
    *,
    name: str = "tiny",
    preset: str | None = None,
    seeds: Sequence[int] | str | None = None,
    sweeps: Sequence[str] | str | None = None,
    out: str | Path = "docs/results",
    scratch: str | Path | None = None,
    progress: bool = True,
    amend: str | None = None,
    plan_only: bool = False,
    report_only: bool = False,
    jobs: int = 1,
    first: Sequence[str] | str | None = None,
):
    """``lensemble study [--name N] [--preset P] [--seeds 0,1,2] [--sweeps a,b|none] [--out DIR]
    [--scratch DIR] [--jobs J] [--first a,b] [--amend REASON] [--plan-only] [--report-only] [--no-progress]
    [OVERRIDES...]``; returns the ``StudyResult``.

    ``overrides`` starting with ``study.`` change the preset (``study.registry.rho_threshold=0.6``,
    ``study.evaluation.parallel=4``); all others are Hydra overrides appended to every run
    (``eval.episodes=50``), except multirun ones (``federation.outer_lr=0.5,0.7``), which add a
    sweep over every ladder arm. ``seeds`` may be a string (``"0-5"``, ``"0,2,4"``) and ``sweeps`` a
    comma list or ``"none"``; ``first`` (a comma list too) moves those groups' missing runs to the
    front without changing the plan or the registry. The preset defaults to ``configs/study/<name>.yaml``. With
    ``report_only`` nothing is planned or run: the report is rebuilt from ``<out>/<name>/``.
    """
    from lensemble.study.plan import is_sweep, with_ladder_sweeps
    from lensemble.study.runner import report_result, run_study
    from lensemble.study.spec import load_study_spec

    if report_only:
        return report_result(Path(out) / name, progress=progress)
    seeds = parse_seeds(seeds) if isinstance(seeds, str) else seeds
    if isinstance(sweeps, str):
        sweeps = [x.strip() for x in sweeps.split(",") if x.strip()]
    if isinstance(first, str):
        first = [x.strip() for x in first.split(",") if x.strip()]
    overrides = list(overrides or [])
    study_ov = [o[len("study."):] for o in overrides if o.startswith("study.")]
    run_ov = [o for o in overrides if not o.startswith("study.")]
    # A multirun override on the command line (key=a,b,c) becomes one more sweep over every ladder arm.
    adhoc = [o for o in run_ov if is_sweep(o)]
    run_ov = [o for o in run_ov if o not in adhoc]
    spec = load_study_spec(preset or name, study_ov, name=name, seeds=seeds, sweeps=sweeps, run_overrides=run_ov)
    spec = with_ladder_sweeps(spec, adhoc)
    return run_study(spec, out=out, scratch=scratch, progress=progress, amend=amend, plan_only=plan_only,
                     jobs=jobs, first=first or ())


def main():  # entry point for `python -m lensemble`
    # Before any command imports Flower or Ray (their loggers read the environment at import).
    if "--verbose" not in sys.argv[1:]:
        from lensemble.observability.console import configure_console

        configure_console(False)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    app()


if __name__ == "__main__":
    sys.exit(main())
