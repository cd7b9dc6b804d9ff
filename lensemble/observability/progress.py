"""Progress display for long work (collection, training, rounds, studies).

A thin wrapper over rich so every long loop shows the same kind of bar and can be silenced
(``enabled=False``) in tests and in CI logs.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@contextmanager
def progress_bar(description: str, total: int, *, enabled: bool = True):
    """Yield ``advance(n=1, **fields)``; shows a bar on stderr when ``enabled``."""
    if not enabled:
        yield lambda n=1, **_: None
        return
    console = Console(file=sys.stderr)
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False, refresh_per_second=4) as prog:
        task = prog.add_task(description, total=total, info="")

        def advance(n: int = 1, info: str = "", **_):
            prog.update(task, advance=n, info=info)

        yield advance
