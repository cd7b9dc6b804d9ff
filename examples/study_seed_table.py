"""Per-seed success table of a study's ladder runs, from its committed summaries (markdown).

    .venv/bin/python examples/study_seed_table.py --study pooled [--results docs/results] [--cell ladder/default]

Rows are arms (local models one row per silo), columns seeds, cells successes of the evaluation's
episodes; a run not finished yet is "–". The README's per-seed table of the pooled study is this
script's output. Verdicts come from ``lensemble study --report-only``, not from this table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LABELS = {
    "warmstart_only": "warm start only",
    "central": "centralized (400 steps)",
    "twin": "data-parallel twin (C3's reference)",
    "central_persilo": "per-silo central control",
    "local": "local, silo {silo} (200 steps)",
    "naive_silo": "naive FedAvg, per-silo objective",
    "naive": "**naive FedAvg, pooled objective**",
    "anchor": "**anchored rung, pooled objective**",
}


def table(results: Path, study: str, cell: str) -> str:
    runs = [json.loads(p.read_text()) for p in sorted((results / study / "runs").glob("*.json"))
            if not p.name.endswith(".failed.json")]
    runs = [r for r in runs if cell in r.get("cells", []) and r.get("eval")]
    seeds = sorted({r["seed"] for r in runs})
    rows: dict[str, dict[int, str]] = {}
    for r in runs:
        label = LABELS.get(r["arm"], r["arm"]).format(silo=r.get("silo"))
        ev = r["eval"]
        rows.setdefault(label, {})[r["seed"]] = f"{ev['n_successes']}"
    n = {r["eval"]["n_episodes"] for r in runs}
    order = [LABELS[a].format(silo=s) for a in LABELS for s in ((0, 1) if a == "local" else (None,))]
    lines = [f"| arm (successes of {'/'.join(map(str, sorted(n)))}) | " + " | ".join(f"s{s}" for s in seeds) + " |",
             "|---|" + "---|" * len(seeds)]
    for label in [o for o in order if o in rows] + [r for r in rows if r not in order]:
        lines.append(f"| {label} | " + " | ".join(rows[label].get(s, "–") for s in seeds) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="pooled")
    ap.add_argument("--results", default="docs/results")
    ap.add_argument("--cell", default="ladder/default")
    args = ap.parse_args()
    print(table(Path(args.results), args.study, args.cell))


if __name__ == "__main__":
    main()
