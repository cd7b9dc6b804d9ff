"""The run report's panels and colours, on the shared primitives of :mod:`lensemble.eval.figures`
(matplotlib without a display, guarded saves, empty panels)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lensemble.eval.figures import empty_panel, pyplot, save_figure  # noqa: F401  (re-exported)

#: Colours per role, so the same model has the same colour in every figure.
COLOURS = {"federated": "#1f5fa8", "warmstart": "#e08a1e", "random": "#8c8c8c", "global": "#202020",
           "twin": "#6a3d9a"}
#: Participants' lines cycle through these (none of them is a role colour above).
PARTICIPANT_COLOURS = ("#2ca02c", "#d62728", "#17becf", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f")


def participant_colour(i: int) -> str:
    return PARTICIPANT_COLOURS[i % len(PARTICIPANT_COLOURS)]


def integer_rounds(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")


def lines_panel(ax, series: Mapping[str, Sequence[tuple[int, float]]], ylabel: str, title: str, *,
                styles: Mapping[str, dict] | None = None, empty: str = "not measured") -> bool:
    """One line per series of (round, value) points; returns whether anything was drawn."""
    drawn = False
    for label, pts in series.items():
        pts = [(x, y) for x, y in pts if y is not None]
        if not pts:
            continue
        style = {"marker": "o", "ms": 4, **((styles or {}).get(label, {}))}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        drawn = True
    if drawn:
        integer_rounds(ax)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=7)
    else:
        empty_panel(ax, empty)
    ax.set_title(title, fontsize=9)
    return drawn


def success_panel(ax, rows: Sequence[tuple[str, int, int, tuple[float, float], str]], title: str) -> None:
    """Success rates as bars with 95 % Wilson intervals; rows are (label, k, n, (lo, hi), colour)."""
    if not rows:
        empty_panel(ax, "not evaluated")
        ax.set_title(title, fontsize=9)
        return
    xs = list(range(len(rows)))
    rates = [k / n for _, k, n, _, _ in rows]
    lo = [r - ci[0] for r, (_, _, _, ci, _) in zip(rates, rows, strict=True)]
    hi = [ci[1] - r for r, (_, _, _, ci, _) in zip(rates, rows, strict=True)]
    ax.bar(xs, rates, yerr=[lo, hi], capsize=5, color=[c for *_, c in rows])
    ax.set_xticks(xs)
    # two-word names on two lines: six bars (with --baselines) do not fit their names on one
    names = [label.replace(" ", "\n", 1) for label, *_ in rows]
    ax.set_xticklabels([f"{name}\n{k}/{n}" for name, (_, k, n, *_) in zip(names, rows, strict=True)], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("closed-loop success (95 % Wilson)", fontsize=8)
    ax.set_title(title, fontsize=9)


def bytes_panel(ax, per_round: Sequence[tuple[int, int]], inner_steps: int, title: str) -> None:
    """Bytes on the wire per round against what per-step synchronisation would send (H ×)."""
    if not per_round:
        empty_panel(ax, "no fed/comm_bytes recorded")
        ax.set_title(title, fontsize=9)
        return
    xs = [t for t, _ in per_round]
    sent = [b for _, b in per_round]
    ax.bar(xs, sent, width=0.5, color=COLOURS["federated"], label="DiLoCo: one exchange per round")
    ax.plot(xs, [inner_steps * b for b in sent], color="#b03030", marker="s", ms=5, ls="--",
            label=f"per-step synchronisation: H = {inner_steps} exchanges")
    ax.set_yscale("log")
    positive = [b for b in sent if b > 0] or [1]
    ax.set_ylim(min(positive) / 4, max(positive) * max(inner_steps, 1) * 4)
    integer_rounds(ax)
    ax.set_ylabel("bytes per round (log)", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)


__all__ = ["COLOURS", "bytes_panel", "empty_panel", "lines_panel", "pyplot", "save_figure", "success_panel"]
