"""Plotting primitives every report shares: matplotlib without a display, guarded saves, empty panels.

Every figure is saved through :func:`save_figure`, which refuses (ResidencyViolation) a
destination inside a silo's private folder before writing anything: reports are made to be shared.
The run report (:mod:`lensemble.report`) and the study report (:mod:`lensemble.study.report`)
build their panels on these.
"""

from __future__ import annotations

from pathlib import Path

from lensemble.data.residency import guard_export


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed); imported on first use only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def empty_panel(ax, text: str) -> None:
    """A panel that says why it holds no data."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def save_figure(fig, path: str | Path, *, dpi: int = 100) -> Path:
    """``tight_layout``, save as PNG (guarded by ``guard_export``), close; return the path."""
    path = Path(path)
    guard_export(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


__all__ = ["pyplot", "empty_panel", "save_figure"]
