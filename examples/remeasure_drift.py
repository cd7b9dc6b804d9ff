"""Re-measure the frame drift of finished federated runs by replaying their rounds.

In some rounds of the room study the full-rotation Procrustes problem was degenerate and every
drift metric of the round was recorded as None. The participants' probe embeddings were not kept,
but a round is deterministic: this script replays the chosen rounds of each run from its saved
state (:func:`lensemble.federation.replay.replay_rounds`, on a copy; the run folder is only read),
re-measures the drift of the replayed participants from the committed global (masking degenerate
pairs where ``frame_drift`` can, ``degenerate="mask"``), and verifies every replayed round against
what the run kept: the participants' inner-optimizer states (bitwise), the committed model's hash
and every drift metric the run recorded as a number (within 1e-6 relative).

    .venv/bin/python examples/remeasure_drift.py --runs naive-s0 --rounds final \\
        --data-root /work/study-wt/data

writes ``<out>/<run_id>.json`` per run and exits 1 when any verification fails, naming it. A round
can be replayed only from the participants' state after the round before it, and a run keeps the
last two rounds' states: ``--rounds final`` needs nothing else, ``--rounds all`` replays from round 0.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from lensemble.artifacts.manifest import git_sha
from lensemble.errors import LensembleError
from lensemble.federation.replay import replay_rounds

REL_TOL = 1e-6
"""A replayed metric must be within this relative distance of the recorded value."""

NOTE = ("Rounds of a finished federated run replayed from its saved state (examples/remeasure_drift.py, "
        "lensemble.federation.replay): the replayed participants' frame drift from the committed global, "
        "degenerate pairs masked where frame_drift can, each round verified against the run's saved "
        "optimizer states, committed model hash and recorded metrics.")


def federated_runs(study_dir: Path) -> list[str]:
    """Run ids of the study's finished federated runs (``<study-dir>/runs/*.json``)."""
    out = []
    for path in sorted((study_dir / "runs").glob("*.json")):
        if json.loads(path.read_text()).get("kind") == "federated":
            out.append(path.stem)
    return out


def parse_rounds(spec: str, completed: int) -> list[int]:
    """``final`` (the last round), ``all`` or a comma list of 0-based rounds."""
    if spec == "final":
        return [completed - 1]
    if spec == "all":
        return list(range(completed))
    try:
        rounds = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--rounds must be final, all or a comma list of rounds, not {spec!r}") from None
    if not rounds or not all(0 <= t < completed for t in rounds):
        raise SystemExit(f"--rounds {spec}: the run has rounds 0..{completed - 1}")
    return rounds


def failures(run_id: str, replayed: list[dict]) -> list[str]:
    """One line per failed verification of the replayed rounds."""
    out = []
    for r in replayed:
        t = r["round"]
        for silo, equal in sorted(r["state_bitwise_equal"].items()):
            if equal is False:
                out.append(f"{run_id} round {t} {silo}: replayed inner state differs from the saved one "
                           f"({', '.join(r['state_mismatches'][silo][:3])})")
        if r["global_hash_equal"] is False:
            out.append(f"{run_id} round {t}: the replayed round does not commit the saved global model")
        for key, (got, rec) in sorted(r["compared"].items()):
            if abs(got - rec) > REL_TOL * abs(rec):
                out.append(f"{run_id} round {t} {key}: replayed {got!r}, recorded {rec!r}")
    return out


def remeasure(run_id: str, args, command: str) -> tuple[dict, list[str]]:
    study_summary = args.study_dir / "runs" / f"{run_id}.json"
    if not study_summary.is_file():
        raise SystemExit(f"no {study_summary}: is {run_id} a run of this study?")
    recorded = json.loads(study_summary.read_text())
    if recorded.get("kind") != "federated":
        raise SystemExit(f"{run_id} is a {recorded.get('kind')} run; only federated runs have rounds")
    run_dir = args.scratch / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("final_hash") != recorded.get("checkpoint_hash"):
        raise SystemExit(f"{run_dir} ends in {str(summary.get('final_hash'))[:16]}…, the study recorded "
                         f"{str(recorded.get('checkpoint_hash'))[:16]}…: not the run the study summarised")
    rounds = parse_rounds(args.rounds, int(summary["rounds_completed"]))
    print(f"{run_id}: replaying rounds {rounds}", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"remeasure-{run_id}-") as tmp:
        work = Path(args.work_dir) / run_id if args.work_dir else Path(tmp)
        replayed = replay_rounds(run_dir, rounds, work_dir=work, data_root=args.data_root, progress=True)
    for r in replayed:
        m = r["metrics"] or {}
        print(f"{run_id} round {r['round']}: drift angle {m.get('gauge/drift_angle_deg')}, subspace angle "
              f"{m.get('gauge/drift_subspace_angle_deg')} deg; states {r['state_bitwise_equal']}, global hash "
              f"equal {r['global_hash_equal']}, recorded max |diff| {r['recorded_max_abs_diff']}, "
              f"{r['seconds']:.1f} s", flush=True)
    failed = failures(run_id, replayed)
    result = {"run_id": run_id, "replayed_rounds": replayed, "verified": not failed, "failures": failed,
              "git_sha": git_sha(), "command": command, "note": NOTE}
    return result, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study-dir", type=Path, default=Path("docs/results/region"),
                    help="the study's results (its runs/<run_id>.json list the runs)")
    ap.add_argument("--scratch", type=Path, default=Path("runs/study/region"), help="the study's run folders")
    ap.add_argument("--runs", nargs="+", default=None, help="run ids (default: every federated run of the study)")
    ap.add_argument("--rounds", default="final", help="final, all, or a comma list of 0-based rounds")
    ap.add_argument("--data-root", default=None,
                    help="the runs' data.root as seen from here (the study ran elsewhere: e.g. /work/study-wt/data)")
    ap.add_argument("--out", type=Path, default=None, help="where <run_id>.json go (default <study-dir>/remeasured)")
    ap.add_argument("--work-dir", default=None, help="keep the replays' work folders here (default: a temporary folder)")
    args = ap.parse_args(argv)
    command = shlex.join(["examples/remeasure_drift.py", *(sys.argv[1:] if argv is None else argv)])
    out = args.out or args.study_dir / "remeasured"
    runs = args.runs or federated_runs(args.study_dir)
    if not runs:
        raise SystemExit(f"no federated runs under {args.study_dir / 'runs'}")
    failed = []
    for run_id in runs:
        try:
            result, bad = remeasure(run_id, args, command)
        except LensembleError as err:  # e.g. a needed state the run no longer keeps: the next run still runs
            failed.append(f"{run_id} not replayed: {err}")
            continue
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{run_id}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        failed += bad
    for line in failed:
        print(f"VERIFICATION FAILED: {line}", file=sys.stderr)
    print(f"{len(runs)} run(s) replayed into {out}; " + (f"{len(failed)} verification(s) failed" if failed
                                                        else "every verification passed"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
