"""Tables the study report derives from the analysis alone: communication and sweep-vs-ladder.

Both read ``analysis["groups"]`` (:func:`lensemble.study.analysis.analyze`): per group and point,
the budget (rounds, H, participants, steps) and per arm the per-seed values and the per-round
curves, among them ``fed/comm_bytes`` (the bytes one round put on the wire, as the engine counts
them).
"""

from __future__ import annotations

from lensemble.eval.stats import paired_t_test
from lensemble.study import power as pw
from lensemble.study.plan import LADDER
from lensemble.study.spec import FEDERATED_ARMS


def communication_rows(groups: dict, *, reference_arm: str = "naive") -> list[dict]:
    """One row per federated (group, point, arm) that recorded ``fed/comm_bytes``.

    Per row: ``bytes_per_round`` (mean over rounds of the mean over seeds), ``rounds``, ``total``
    (their sum: the bytes of one run), ``per_step_sync`` (the same payload exchanged after each of
    the participant's ``rounds × H`` steps instead of once per round: H × total) and
    ``reduction`` = per_step_sync / total (= H). ``reduction_vs_float32`` compares with per-step
    synchronisation of the ladder's ``reference_arm`` payload (float32, the same model and
    participant count: its bytes per round × the row's steps) and is None where that reference
    does not apply (another model or participant count, or no reference recorded); for an int8
    row it is H × the quantisation's own ratio.
    """
    ref = None
    ladder = (groups.get(LADDER) or {}).get("default")
    if ladder:
        curve = ((ladder["arms"].get(reference_arm) or {}).get("curves") or {}).get("fed/comm_bytes")
        vals = [v for v in (curve or {}).get("mean", []) if v is not None]
        if vals:
            ref = {"bytes_per_round": sum(vals) / len(vals), "participants": ladder["budget"]["participants"]}
    rows = []
    for group, points in groups.items():
        for point, cell in points.items():
            budget = cell.get("budget") or {}
            for arm in FEDERATED_ARMS:
                st = cell["arms"].get(arm)
                curve = ((st or {}).get("curves") or {}).get("fed/comm_bytes")
                vals = [v for v in (curve or {}).get("mean", []) if v is not None]
                if not vals:
                    continue
                h = int(budget.get("inner_steps") or 0)
                steps = int(budget.get("participant_steps") or 0)
                total = float(sum(vals))
                per_round = total / len(vals)
                # the float32 reference holds for the study's own model and participant count only
                same_model = (ref is not None and not str(cell.get("key") or "").startswith("model.")
                              and budget.get("participants") == ref["participants"])
                rows.append({
                    "group": group, "point": point, "arm": arm, "inner_steps": h, "rounds": len(vals),
                    "participants": budget.get("participants"), "bytes_per_round": per_round, "total": total,
                    "per_step_sync": h * total, "reduction": h if total else None,
                    "reduction_vs_float32": (steps * ref["bytes_per_round"] / total) if same_model and total else None,
                    "success": (st.get("success") or {}).get("mean"),
                })
    return rows


def paired_vs_ladder(groups: dict, group: str, point: str, arm: str, metric: str = "success") -> dict | None:
    """The sweep point's ``arm`` minus the ladder's same arm on the seeds both have: the mean
    per-seed difference of ``metric`` with its 95 % Student-t interval (None without two paired
    seeds). Descriptive: the sweeps are not part of any Holm family."""
    ladder = (groups.get(LADDER) or {}).get("default")
    cell = (groups.get(group) or {}).get(point)
    if not ladder or not cell or arm not in cell["arms"] or arm not in ladder["arms"]:
        return None
    a = cell["arms"][arm].get("per_seed") or {}
    b = ladder["arms"][arm].get("per_seed") or {}
    diffs = [a[s][metric] - b[s][metric] for s in sorted(set(a) & set(b))
             if a[s].get(metric) is not None and b[s].get(metric) is not None]
    if len(diffs) < 2:
        return {"n": len(diffs), "mean": diffs[0] if diffs else None, "ci": None}
    t = paired_t_test(diffs, delta=1.0)  # the registered test's t interval; δ enters only its p-values
    return {"n": t.n, "mean": t.estimate, "ci": [t.ci.low, t.ci.high]}


def achieved_precision(component: dict, *, alpha: float, power: float) -> dict:
    """What one decided comparison could resolve, from its own data: the achieved MDE (the
    registered one-sided t test at ``alpha`` with the observed per-seed SD and n, for ``power``)
    and whether its 95 % interval is narrower than 2δ, the issue's bar for an inconclusive
    verdict to say "no effect as large as δ" (width and the flag are None without an interval)."""
    sd, n, ci, delta = component.get("sd"), component.get("n") or 0, component.get("ci"), component.get("delta")
    mde = pw.t_mde(float(sd), int(n), alpha, power) if sd is not None and n >= 2 else None
    width = float(ci[1] - ci[0]) if ci and None not in ci else None
    return {"achieved_mde": mde, "ci_width": width,
            "narrower_than_2delta": (width < 2 * float(delta)) if width is not None and delta else None}


__all__ = ["rho_table_lines", "achieved_precision", "communication_rows", "paired_vs_ladder"]


def rho_table_lines(rows: list[dict], label, numbers) -> list[str]:
    """Markdown lines of the descriptive ρ table (``analysis["rho_table"]``): every federated arm
    of the ladder against each centralized reference that ran; ``label(arm)`` names an arm,
    ``numbers(row)`` formats ρ. Empty when no row has a reference."""
    if not rows:
        return []
    out = ["### Gap recovery against each reference (descriptive)", "",
           "ρ = (S_arm − S_local) / (S_ref − S_local) over the paired seeds; the centralized arm takes the "
           "federation's total steps, the data-parallel twin its sequential steps at C × the batch. Only claim 3 "
           "decides; these rows describe.", "", "| arm | reference | ρ |", "|---|---|---|"]
    out += [f"| {label(r['arm'])} | {label(r['reference'])} | {numbers(r)} |" for r in rows]
    return out + [""]
