"""Secure aggregation: bytes and seconds per round with and without SecAgg+, as ratios.

Runs the same DiLoCo federation twice in one invocation, plaintext and with
``federation.secure_aggregation=true`` (same config, warm start and data otherwise), and prints
per-round means and the ratio secure / plaintext of:

* ``bytes``: ``fed/comm_bytes``, the payload bytes the ServerApp counted (plaintext: the global
  arrays to every node plus every reply's arrays; secure: the same plus the SecAgg+ keys,
  encrypted shares and masked vectors, which travel as bytes in config records). On the
  in-process grid the protobuf size of every message is counted too (``proto``: framing, the
  round config with the resolved config JSON, metrics), the closest to what a real link carries.
* ``seconds``: ``fed/round_seconds`` (from the first message out to the last reply in), and the
  round minus the slowest participant's own compute (``fed/max_compute_seconds``): what the
  protocol costs on top of training (three extra message exchanges, key agreement, Shamir
  shares, masking and unmasking).

The engines: ``flower-inprocess`` (the real apps on the in-process grid; default) or ``ray``
(``--engine ray``: ``flwr run`` on a local simulation SuperLink; start-up is outside the rounds).
On a shared 2-core machine absolute seconds swing with the load: only the ratios, measured here
side by side, mean anything. The order alternates per repetition (``--reps``).

    .venv/bin/python benchmarks/bench_secagg.py --small            # experiment=micro, ~1 min
    .venv/bin/python benchmarks/bench_secagg.py                    # default model, micro-sized data
    .venv/bin/python benchmarks/bench_secagg.py --small --engine ray --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

# experiment=micro's silo data (configs/experiment/micro.yaml), laid over the default config.
MICRO_DATA = ["data.episodes_per_silo=4", "data.steps_per_episode=30", "data.heldout_episodes=1",
              "data.probe_frames=32", "data.public_episodes=4", "data.workers=1"]


class ProtoCounter:
    """Sizes every message's protobuf on the in-process grid (its wire copy), per run."""

    def __init__(self):
        self.total = 0

    def install(self):
        from lensemble.federation.flower import local_grid

        counter = self

        def wire_copy(msg):
            proto = local_grid.message_to_proto(msg)
            counter.total += proto.ByteSize()
            return local_grid.message_from_proto(proto)

        local_grid._wire_copy = wire_copy

    def take(self) -> int:
        out, self.total = self.total, 0
        return out


def run_once(cfg, run_dir: Path, engine: str) -> list[dict]:
    from lensemble.federation.simulation import run_federated_simulation

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_federated_simulation(cfg, run_dir, engine=engine, progress=False)
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _metric(rows: list[dict], key: str) -> list[float]:
    out = []
    for row in rows:
        m = row.get("metrics", row)
        if key in m:
            out.append(float(m[key]))
    return out


def add_pair_args(ap: argparse.ArgumentParser, *, pair: str, workdir: str) -> None:
    """The flags every two-arm federation benchmark here takes (this one and bench_pooled.py)."""
    ap.add_argument("--small", action="store_true", help="experiment=micro for everything")
    ap.add_argument("--engine", default="flower-inprocess", choices=["flower-inprocess", "ray"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner-steps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=1, help=f"{pair} pairs, order alternating")
    ap.add_argument("--warmstart-steps", type=int, default=20)
    ap.add_argument("--workdir", default=workdir)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for both runs")


def warm_base(args, work: Path, extra: list[str] = ()) -> tuple[list[str], object]:
    """(overrides both arms share, ending with the warm start they share; the warm start's TrainResult)."""
    from lensemble.config import load_config
    from lensemble.training.warmstart import train_warmstart

    work.mkdir(parents=True, exist_ok=True)
    base = (["experiment=micro"] if args.small else list(MICRO_DATA)) + list(extra) + [
        f"data.root={work / 'data'}", f"federation.rounds={args.rounds}",
        f"federation.inner_steps={args.inner_steps}", f"train.warmstart_steps={args.warmstart_steps}",
        *args.overrides]
    ws = train_warmstart(load_config(base), run_dir=work / "warmstart", progress=False)
    return base + [f"federation.warmstart={ws.checkpoint_dir}"], ws


def alternate_runs(cfgs: dict, args, work: Path, proto: "ProtoCounter",
                   extra_metrics: dict[str, str] | None = None) -> dict[str, dict[str, list[float]]]:
    """Run the two arms of ``cfgs`` ``args.reps`` times in alternating order; per arm, per round:
    bytes, seconds, seconds beyond the slowest participant's compute, protobuf bytes, and any
    ``extra_metrics`` (result key -> metric name)."""
    extra_metrics = extra_metrics or {}
    keys = ("bytes", "seconds", "overhead", "proto", *extra_metrics)
    results: dict[str, dict[str, list[float]]] = {k: {m: [] for m in keys} for k in cfgs}
    names = list(cfgs)
    for rep in range(args.reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            rows = run_once(cfgs[name], work / f"run-{name}", args.engine)
            results[name]["bytes"] += _metric(rows, "fed/comm_bytes")
            for key, metric in extra_metrics.items():
                results[name][key] += _metric(rows, metric)
            secs = _metric(rows, "fed/round_seconds")
            comp = _metric(rows, "fed/max_compute_seconds")
            results[name]["seconds"] += secs
            results[name]["overhead"] += [a - b for a, b in zip(secs, comp, strict=True)]
            total = proto.take()
            if total:
                results[name]["proto"].append(total / max(len(rows), 1))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_args(ap, pair="plaintext/secure", workdir="/tmp/lensemble-bench-secagg")
    args = ap.parse_args()

    import torch

    from lensemble.artifacts.checkpoint import load_checkpoint
    from lensemble.config import load_config
    from lensemble.federation.secure_agg import SecAggSettings
    from lensemble.federation.state import federated_keys

    torch.set_num_threads(1)
    work = Path(args.workdir)
    base, ws = warm_base(args, work)
    cfgs = {"plain": load_config(base), "secure": load_config(base + ["federation.secure_aggregation=true"])}
    s = SecAggSettings.from_config(cfgs["secure"].federation)
    warm = load_checkpoint(ws.checkpoint_dir).tensors
    keys = federated_keys(cfgs["plain"])
    n = sum(int(v.numel()) for k, v in warm.items() if k in keys and v.is_floating_point())
    proto = ProtoCounter()
    if args.engine == "flower-inprocess":
        proto.install()

    results = alternate_runs(cfgs, args, work, proto)

    cfg = cfgs["plain"]
    print(f"\nsecure aggregation benchmark: engine {args.engine}, C = {cfg.data.num_silos}, "
          f"{args.rounds} rounds x H = {args.inner_steps}, {args.reps} rep(s); SecAgg+ c = {s.clip_range:g}, "
          f"b = {s.bits}, t = {s.threshold}, mean error bound q = {s.quantum:.3g}, n = {n:,}")
    print(f"{'per round':<38} {'plaintext':>14} {'secure':>14} {'secure/plain':>13}")

    def row(label: str, key: str, fmt: str) -> float | None:
        a, b = results["plain"][key], results["secure"][key]
        if not a or not b:
            return None
        ma, mb = statistics.mean(a), statistics.mean(b)
        ratio = mb / ma if ma else float("nan")
        print(f"{label:<38} {format(ma, fmt):>14} {format(mb, fmt):>14} {ratio:>12.2f}x")
        return ratio

    rb = row("bytes (fed/comm_bytes)", "bytes", ",.0f")
    rp = row("bytes (protobuf messages)", "proto", ",.0f")
    rs = row("seconds (fed/round_seconds)", "seconds", ".2f")
    ro = row("seconds beyond the slowest compute", "overhead", ".2f")
    print(f"ratio secure/plain bytes per round: {rb:.2f}x"
          + (f" (protobuf {rp:.2f}x)" if rp else "") + f"; seconds per round: {rs:.2f}x; "
          f"seconds beyond compute: {ro:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
