"""The study report's figures: the PNGs in ``<study>/figures/``, drawn from the analysis alone.

:func:`write_figures` draws every figure :mod:`lensemble.study.report` links from ``report.md``:
the ladder's frame drift per round, success, effective dimension and latent std per arm, gap
recovery ρ against severity, the λ_anc sweep, and one row of panels per other sweep. The arm
labels live here too, so that the figure legends and the report's tables name each arm alike.

The figures folder is checked before anything is written to it: it must not be inside a silo's
private folder (``guard_export``).
"""

from __future__ import annotations

from pathlib import Path

from lensemble.config.rungs import RUNGS
from lensemble.data.residency import guard_export
from lensemble.eval.figures import empty_panel, pyplot, save_figure
from lensemble.study.plan import LADDER
from lensemble.study.spec import ALL_ARMS, FEDERATED_ARMS

FIG_DIR = "figures"
FIGURES = ("drift_rounds.png", "success.png", "effective_dim.png", "latent_std.png", "rho_severity.png",
           "lambda_anc.png")
# What each rung adds to the one below it (the ladder is additive); the numbering follows RUNGS.
_RUNG_TEXT = {"naive": "naive FedAvg", "sketch": "+ shared sketch", "backstop": "+ Procrustes backstop",
              "anchor": "+ frame anchor", "distill": "+ distillation"}
_ARM_LABEL = {"warmstart_only": "warm start only (no training)", "central": "centralized (pooled)", "local": "local-only (mean over silos)",
              "local_best": "local-only (best silo)",
              **{rung: f"{i} {_RUNG_TEXT.get(rung, rung)}" for i, rung in enumerate(RUNGS, start=1)},
              "fork_a": "Fork A (frozen encoder)", "twin": "data-parallel twin (sequential steps, C × batch)",
              "central_persilo": "central, per-silo batch statistics (control)",
              "naive_silo": "0 naive FedAvg, per-silo objective"}


def _curve_panel(ax, arms: dict, metric: str, ylabel: str, title: str) -> None:
    drawn = False
    for arm in FEDERATED_ARMS:
        curve = (arms.get(arm) or {}).get("curves", {}).get(metric)
        if not curve:
            continue
        xs = [i for i, v in enumerate(curve["mean"]) if v is not None]
        if not xs:
            continue
        ys = [curve["mean"][i] for i in xs]
        line, = ax.plot(xs, ys, marker="o", label=_ARM_LABEL.get(arm, arm))
        lo = [curve["low"][i] for i in xs]
        hi = [curve["high"][i] for i in xs]
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
        drawn = True
    if not drawn:
        empty_panel(ax, f"no {ylabel} in the run summaries\n(not recorded by these runs, degenerate frames,\nor no federated arm)")
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)


def _bars(ax, arms: dict, metric: str, ylabel: str, title: str, *, wilson: bool = False) -> None:
    names, means, los, his = [], [], [], []
    extra = []
    for arm, st in arms.items():
        for key, label in ((metric, arm), ("success_best", "local_best") if metric == "success" and arm == "local"
                           else (None, None)):
            if key is None or not st.get(key) or st[key].get("mean") is None:
                continue
            s = st[key]
            names.append(_ARM_LABEL.get(label, label))
            means.append(s["mean"])
            ci = s.get("ci") or [s["mean"], s["mean"]]
            los.append(s["mean"] - ci[0])
            his.append(ci[1] - s["mean"])
            if wilson and key == "success" and st.get("pooled_success"):
                extra.append((len(names) - 1, st["pooled_success"]["wilson"]))
    if not names:
        empty_panel(ax, f"no {ylabel} yet")
        ax.set_title(title, fontsize=10)
        return
    xs = list(range(len(names)))
    ax.bar(xs, means, yerr=[los, his], capsize=4, color="#8fb3d9", label="mean over seeds, 95% t CI")
    for i, (lo, hi) in extra:
        ax.plot([i + 0.25, i + 0.25], [lo, hi], color="#b03030", lw=2)
    if extra:
        ax.plot([], [], color="#b03030", lw=2, label="pooled episodes, 95% Wilson")
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)


def _xs(values: list[str]) -> tuple[list[float], bool]:
    try:
        return [float(v) for v in values], True
    except ValueError:
        return list(range(len(values))), False


def _sweep_panel(ax, group: dict, arms: list[str], metric: str, ylabel: str, key_label: str) -> None:
    points = list(group.items())
    xs, numeric = _xs([p for p, _ in points])
    drawn = False
    for arm in arms:
        pts = [(x, cell["arms"].get(arm, {}).get(metric)) for x, (_, cell) in zip(xs, points, strict=True)]
        pts = [(x, s) for x, s in pts if s and s.get("mean") is not None]
        if not pts:
            continue
        x = [p[0] for p in pts]
        y = [p[1]["mean"] for p in pts]
        lo = [p[1]["mean"] - (p[1]["ci"] or [p[1]["mean"]] * 2)[0] for p in pts]
        hi = [(p[1]["ci"] or [p[1]["mean"]] * 2)[1] - p[1]["mean"] for p in pts]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=_ARM_LABEL.get(arm, arm))
        drawn = True
    if not drawn:
        empty_panel(ax, f"no {ylabel} measured")
        return
    if not numeric:
        ax.set_xticks(xs)
        ax.set_xticklabels([p for p, _ in points])
    elif all(x > 0 for x in xs) and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set_xlabel(key_label)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def _rho_panel(ax, rows: list[dict], key_label: str, threshold: float | None) -> None:
    xs, numeric = _xs([r["value"] for r in rows])
    defined = [(x, r["rho"]) for x, r in zip(xs, rows, strict=True) if r.get("rho") and r["rho"].get("rho") is not None]
    undefined = [x for x, r in zip(xs, rows, strict=True) if not (r.get("rho") and r["rho"].get("rho") is not None)]
    if defined:
        x = [d[0] for d in defined]
        y = [d[1]["rho"] for d in defined]
        lo = [d[1]["rho_ci"][0] if d[1].get("rho_ci") and d[1]["rho_ci"][0] is not None else y[i]
              for i, d in enumerate(defined)]
        hi = [d[1]["rho_ci"][1] if d[1].get("rho_ci") and d[1]["rho_ci"][1] is not None else y[i]
              for i, d in enumerate(defined)]
        ax.plot(x, y, marker="o", color="#205080", label="ρ")
        ax.fill_between(x, lo, hi, color="#205080", alpha=0.2, label="95% paired bootstrap")
    if undefined:
        ax.scatter(undefined, [0.0] * len(undefined), marker="x", color="#b03030",
                   label="undefined (no measurable gap)")
    if threshold is not None:
        ax.axhline(threshold, ls="--", color="grey", lw=1, label=f"registered threshold {threshold}")
    ax.axhline(0, color="black", lw=0.5)
    ax.axhline(1, color="black", lw=0.5, ls=":")
    if not numeric:
        ax.set_xticks(xs)
        ax.set_xticklabels([r["value"] for r in rows])
    ax.set_xlabel(key_label)
    ax.set_ylabel("gap recovery ρ")
    ax.legend(fontsize=7)


def write_figures(study_dir: Path, analysis: dict) -> list[str]:
    """Draw every figure into ``<study>/figures/``; return their paths relative to the study folder."""
    plt = pyplot()
    fig_dir = study_dir / FIG_DIR
    guard_export(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    arms = analysis["groups"].get(LADDER, {}).get("default", {}).get("arms", {})
    threshold = next((c["rho"]["threshold"] for c in analysis["claims"] if c["id"] == "C3" and c.get("rho")), None)
    out = []

    # Each panel names its quantity (docs/gauge.md §3): which frames are compared, and how.
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    _curve_panel(axes[0, 0], arms, "gauge/drift_angle_deg", "geodesic angle (degrees)",
                 "Participant's unaligned frame → new global (mean over participants)")
    _curve_panel(axes[0, 1], arms, "gauge/drift_subspace_angle_deg", "geodesic angle (degrees)",
                 "The same rotation within the global's 95 %-energy subspace")
    _curve_panel(axes[1, 0], arms, "gauge/drift_rel_residual_before", "||E − G||_F / ||G||_F",
                 "Variance-weighted: participant → global, before alignment")
    _curve_panel(axes[1, 1], arms, "gauge/backstop_aligned_angle_deg", "geodesic angle (degrees)",
                 "Backstop: rotation left after its alignment (held-out frames)")
    fig.suptitle("Frame drift per round (mean over seeds, band = min–max over seeds)", fontsize=11)
    save_figure(fig, fig_dir / "drift_rounds.png", dpi=110)

    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, arms, "success", "MPC success rate", "Closed-loop success per rung and baseline", wilson=True)
    save_figure(fig, fig_dir / "success.png", dpi=110)

    for name, metric, round_metric, label in (
        ("effective_dim.png", "effective_dim", "gauge/global_effective_dim", "effective dimension"),
        ("latent_std.png", "latent_std", "gauge/global_latent_std", "latent std"),
    ):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        _bars(a1, arms, metric, label, f"Final model, held-out frames ({label})")
        _curve_panel(a2, arms, round_metric, label, f"Global model on the probe per round ({label})")
        save_figure(fig, fig_dir / name, dpi=110)

    sev = analysis["sweeps"].get("severity")
    fig, ax = plt.subplots(figsize=(6, 4))
    if sev:
        _rho_panel(ax, sev, "non-IID severity", threshold)
        ax.set_title("Gap recovery ρ against non-IID severity", fontsize=10)
    else:
        empty_panel(ax, "no severity sweep in this study")
    save_figure(fig, fig_dir / "rho_severity.png", dpi=110)

    lam = analysis["groups"].get("lambda_anc")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    if lam:
        _sweep_panel(a1, lam, ["anchor"], "drift_final", "final drift °: unaligned participant → global", "λ_anc")
        _sweep_panel(a2, lam, ["anchor"], "success", "MPC success rate", "λ_anc")
        a1.set_title("Frame drift against λ_anc", fontsize=10)
        a2.set_title("Success against λ_anc", fontsize=10)
    else:
        empty_panel(a1, "no λ_anc sweep in this study")
        empty_panel(a2, "")
    save_figure(fig, fig_dir / "lambda_anc.png", dpi=110)
    out += [f"{FIG_DIR}/{n}" for n in FIGURES]

    for g, group in analysis["groups"].items():
        if g in (LADDER, "lambda_anc"):
            continue
        key = next(iter(group.values()))["key"] or g
        sweep_arms = sorted({a for cell in group.values() for a in cell["arms"]},
                            key=lambda a: ALL_ARMS.index(a) if a in ALL_ARMS else len(ALL_ARMS))
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        _sweep_panel(axes[0], group, [a for a in sweep_arms if a in FEDERATED_ARMS], "drift_final", "final drift °: unaligned participant → global", key)
        _sweep_panel(axes[1], group, sweep_arms, "success", "MPC success rate", key)
        _rho_panel(axes[2], analysis["sweeps"].get(g, []), key, threshold)
        axes[0].set_title(f"Frame drift against {key}", fontsize=10)
        axes[1].set_title(f"Success against {key}", fontsize=10)
        axes[2].set_title(f"ρ against {key}", fontsize=10)
        save_figure(fig, fig_dir / f"sweep_{g}.png", dpi=110)
        out.append(f"{FIG_DIR}/sweep_{g}.png")
    return out


__all__ = ["FIGURES", "FIG_DIR", "write_figures"]
