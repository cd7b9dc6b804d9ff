"""Success on each silo's own tasks: does a model serve every participant's conditions?

On the ``heldout`` split episode i takes the factor value ``seen[i mod len(seen)]``
(:func:`lensemble.eval.closed_loop.heldout_value_indices`); at severity > 0 each value belongs to
the home set of one silo (two with ``data.shared_homes``). That gives every episode an *owner*,
and a model's success splits by owner:

- a local model of silo c: its own silo's tasks against the other silos' tasks (what it never
  saw at severity 1);
- every other arm: the worst and the best silo's tasks (a federation that serves one room only
  has a low worst-silo success even when its mean looks fine).

Descriptive, for the ladder of a study: no claim is decided on it. Reads only the plan, the
summaries' per-episode records and the composed ladder config (a pure function of the seed).
"""

from __future__ import annotations

import numpy as np

from lensemble.config.loader import load_config
from lensemble.eval.closed_loop import heldout_value_indices
from lensemble.study.plan import LADDER


def episode_owners(cfg, n_episodes: int) -> list[tuple[int, ...]]:
    """For episodes 0..n-1 of ``cfg``'s heldout split: the silos whose home set holds the episode's
    factor value (empty where no silo owns it, e.g. at severity 0)."""
    plan, seen = heldout_value_indices(cfg, cfg.env.id)
    if not seen or cfg.data.severity == 0:  # at severity 0 the home sets are dealt but never favoured
        return [() for _ in range(n_episodes)]
    return [tuple(c for c in range(plan.num_silos) if seen[i % len(seen)] in plan.home[c]) for i in range(n_episodes)]


def _rate(outcomes: list[float]) -> float | None:
    return float(np.mean(outcomes)) if outcomes else None


def split_by_owner(episodes: list[dict], owners: list[tuple[int, ...]], num_silos: int) -> dict[int, float | None]:
    """``{silo: success rate on the episodes it owns}`` from per-episode records (``index``, ``success``)."""
    by: dict[int, list[float]] = {c: [] for c in range(num_silos)}
    for e in episodes:
        for c in owners[int(e["index"])]:
            by[c].append(float(bool(e["success"])))
    return {c: _rate(v) for c, v in by.items()}


def home_split(plan: dict, summaries: dict) -> dict | None:
    """Per ladder arm, the mean over seeds of its success on its own / other silos' tasks (local)
    or on the worst / best silo's tasks (every other arm), with the seeds used. None when the
    ladder has no homes to split by (severity 0, held-out factors, or one silo)."""
    cell = (plan.get("groups", {}).get(LADDER) or {}).get("default")
    if not cell:
        return None
    base = load_config(list(cell["overrides"]))
    if base.eval.heldout_factors or base.data.severity == 0 or base.data.num_silos < 2:
        return None
    c_num = base.data.num_silos
    out: dict[str, dict] = {}
    for arm, per_seed in cell["arms"].items():
        rows = []
        for seed, ids in per_seed.items():
            recs = [summaries.get(i) for i in ids]
            if not ids or any(r is None or not (r.get("eval") or {}).get("episodes") for r in recs):
                continue
            cfg = base.model_copy(update={"root_seed": int(seed)})
            n = max(int(e["index"]) for r in recs for e in r["eval"]["episodes"]) + 1
            owners = episode_owners(cfg, n)
            if arm == "local":
                own, other = [], []
                for silo, r in enumerate(recs):
                    mine = [float(bool(e["success"])) for e in r["eval"]["episodes"] if silo in owners[int(e["index"])]]
                    rest = [float(bool(e["success"])) for e in r["eval"]["episodes"]
                            if owners[int(e["index"])] and silo not in owners[int(e["index"])]]
                    own.append(_rate(mine))
                    other.append(_rate(rest))
                if None not in own + other:
                    rows.append((float(np.mean(own)), float(np.mean(other))))
            else:
                split = split_by_owner(recs[0]["eval"]["episodes"], owners, c_num)
                vals = [v for v in split.values() if v is not None]
                if len(vals) == c_num:
                    rows.append((min(vals), max(vals)))
        if rows:
            a, b = np.asarray(rows).T
            out[arm] = {"labels": ("own silo's tasks", "other silos' tasks") if arm == "local"
                        else ("worst silo's tasks", "best silo's tasks"),
                        "values": [float(a.mean()), float(b.mean())], "n_seeds": len(rows)}
    return out or None


__all__ = ["episode_owners", "home_split", "split_by_owner"]
