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
    console.print(f"[bold red]error[/] {exc}")
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


def main():  # entry point for `python -m lensemble`
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    app()


if __name__ == "__main__":
    sys.exit(main())
