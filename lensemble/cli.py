"""The ``lensemble`` command. Every command takes Hydra overrides as trailing arguments, e.g.

    lensemble data collect experiment=micro data.num_silos=3
"""

from __future__ import annotations

import json
import os
import sys

import typer
from rich.console import Console

from lensemble.errors import LensembleError

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
    """Print the composed, validated config as JSON (and its hash)."""
    try:
        cfg = _load(overrides)
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


@app.command("run")
def run(engine: str = typer.Option("ray", help="ray (Flower simulation engine) | flower-inprocess | inprocess"),
        overrides: list[str] = OVERRIDES):
    """Run a federated DiLoCo training (resumes a run folder that already holds rounds)."""
    from lensemble.federation.simulation import run_federated_simulation

    try:
        cfg = _load(overrides)
        summary = run_federated_simulation(cfg, cfg.run_dir, engine=engine)
    except LensembleError as exc:
        _fail(exc)
    last = summary["rounds"][-1] if summary.get("rounds") else {}
    console.print(f"[bold]{summary['rounds_completed']}[/] rounds · final checkpoint {summary['final_checkpoint']}")
    console.print(f"final hash {summary['final_hash']}")
    keys = ("loss/pred", "gauge/drift_angle_deg", "gauge/effective_dim", "fed/comm_bytes", "dp/epsilon")
    console.print({k: last[k] for k in keys if k in last})


@app.command("evaluate")
def evaluate_cmd(checkpoint: str = typer.Argument(..., help="checkpoint folder"),
                 env: str = typer.Option("swm/TwoRoom-v1", help="environment id"),
                 episodes: int = typer.Option(None, help="episodes (default: eval.episodes)"),
                 split: str = typer.Option("heldout", help="heldout | factor (transfer values)"),
                 policy: str = typer.Option("mpc", help="mpc | random (control)"),
                 ladder: bool = typer.Option(True, help="also run the evaluation ladder"),
                 out: str = typer.Option(None, help="write the EvalReport JSON here"),
                 overrides: list[str] = OVERRIDES):
    """Closed-loop latent-MPC success and the evaluation ladder for one checkpoint."""
    from lensemble.eval.harness import cli_evaluate

    try:
        report = cli_evaluate(checkpoint, env, episodes, split, policy, out, list(overrides or []), ladder=ladder)
    except LensembleError as exc:
        _fail(exc)
    print(report.to_json() if hasattr(report, "to_json") else report.model_dump_json(indent=1))


@app.command("study")
def study(name: str = typer.Option("tiny", help="study name (results under <out>/<name>)"),
          preset: str = typer.Option(None, help="study preset in configs/study/ (default: the name)"),
          seeds: str = typer.Option(None, help="seeds, e.g. 0-5 or 0,2"),
          sweeps: str = typer.Option(None, help="sweeps to run, e.g. severity,participants or none"),
          out: str = typer.Option("docs/results", help="where summaries, registry and report go"),
          scratch: str = typer.Option(None, help="scratch folder for checkpoints (default runs/study/<name>)"),
          jobs: int = typer.Option(1, help="runs in parallel (one torch thread each)"),
          amend: str = typer.Option(None, help="reason for changing the registry after runs started"),
          plan_only: bool = typer.Option(False, help="write registry and plan, print the cost estimate"),
          report_only: bool = typer.Option(False, help="rebuild analysis and report from summaries"),
          progress: bool = typer.Option(True, help="show progress"),
          overrides: list[str] = OVERRIDES):
    """The ablation ladder, baselines and sweeps with a pre-registered analysis and a report."""
    from lensemble.eval.study import study_command

    try:
        res = study_command(list(overrides or []), name=name, preset=preset, seeds=seeds, sweeps=sweeps,
                            out=out, scratch=scratch, progress=progress, amend=amend, plan_only=plan_only,
                            report_only=report_only, jobs=jobs)
    except LensembleError as exc:
        _fail(exc)
    console.print(f"planned {res.planned} · executed {res.executed} · skipped {res.skipped} · failed {len(res.failed)}")
    if res.report:
        console.print(f"report {res.report}")
    if res.failed:
        raise typer.Exit(code=1)


@app.command("drift")
def drift(checkpoints: list[str] = typer.Argument(..., help="checkpoint folders (one per participant)"),
          probe: str = typer.Option(..., help="the public probe file (.npz)"),
          probe_hash: str = typer.Option(None, help="expected probe hash (default: the checkpoints' own)"),
          out: str = typer.Option(None, help="write the FrameDriftReport JSON here"),
          singular_floor: float = typer.Option(1e-6, help="relative singular-value floor")):
    """Frame drift between checkpoints on the pinned public probe."""
    from lensemble.gauge.checkpoints import drift_between_checkpoints

    try:
        report = drift_between_checkpoints(checkpoints, probe, expected_probe_hash=probe_hash,
                                           singular_floor=singular_floor)
    except LensembleError as exc:
        _fail(exc)
    text = report.model_dump_json(indent=1)
    if out:
        from pathlib import Path

        Path(out).write_text(text)
    print(text)


def main():  # entry point for `python -m lensemble`
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    app()


if __name__ == "__main__":
    sys.exit(main())
