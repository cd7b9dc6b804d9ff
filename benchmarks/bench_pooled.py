"""The pooled objective: bytes and seconds per round against the silo objective, as ratios.

Runs the same DiLoCo federation twice in one invocation, with the silo objective (the default:
each participant's SIGReg and BatchNorm on its own batch) and with the pooled objective
(``objective.sigreg_scope=pooled objective.bn_scope=pooled``: a summary ask at each round's start,
docs/federation.md "The pooled objective"); same config, warm start and data otherwise (both with
a BatchNorm projector, ``model.projector_norm=batchnorm model.input_norm=global``). Prints
per-round means and the ratio pooled / silo of:

* ``bytes``: ``fed/comm_bytes``, the array payload bytes the ServerApp counted, both asks of a
  pooled round included (``fed/summary_bytes``: the summary ask's share, the global model sent
  down once plus the summaries up); on the in-process grid also the protobuf size of every
  message (``proto``: framing, round configs, metrics). The pooled round's train ask sends no
  global to the participants that kept it from the summary ask (federation/global_cache.py); the
  line "without the kept global" adds back what sending it again would cost (C x the global's
  record bytes), the ~1.5x a pooled round cost before;
* ``seconds``: ``fed/round_seconds`` (both asks), and the round minus the slowest participant's
  own compute (``fed/max_compute_seconds``, the train ask's).

On a shared 2-core machine absolute seconds swing with the load: only the ratios, measured side
by side, mean anything. The order alternates per repetition (``--reps``).

    .venv/bin/python benchmarks/bench_pooled.py --small            # experiment=micro, ~1 min
    .venv/bin/python benchmarks/bench_pooled.py                    # default model, micro-sized data
    .venv/bin/python benchmarks/bench_pooled.py --small --secure   # both runs under SecAgg+
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_secagg import ProtoCounter, add_pair_args, alternate_runs, warm_base  # noqa: E402

BN = ["model.projector_norm=batchnorm", "model.input_norm=global"]
POOLED = ["objective.sigreg_scope=pooled", "objective.bn_scope=pooled"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_args(ap, pair="silo/pooled", workdir="/tmp/lensemble-bench-pooled")
    ap.add_argument("--secure", action="store_true", help="both runs under federation.secure_aggregation")
    args = ap.parse_args()

    import torch

    from lensemble.artifacts.checkpoint import load_checkpoint
    from lensemble.config import load_config
    from lensemble.federation.flower.records import arrays_to_record, record_nbytes
    from lensemble.federation.pooling import summary_numel
    from lensemble.federation.state import to_arrays

    torch.set_num_threads(1)
    work = Path(args.workdir)
    base, ws = warm_base(args, work, BN + (["federation.secure_aggregation=true"] if args.secure else []))
    cfgs = {"silo": load_config(base), "pooled": load_config(base + POOLED)}
    global_bytes = record_nbytes(arrays_to_record(to_arrays(load_checkpoint(ws.checkpoint_dir).tensors)))
    proto = ProtoCounter()
    if args.engine == "flower-inprocess":
        proto.install()

    results = alternate_runs(cfgs, args, work, proto, {"summary": "fed/summary_bytes"})

    cfg = cfgs["pooled"]
    c = cfg.data.num_silos
    print(f"\npooled objective benchmark: engine {args.engine}{' under SecAgg+' if args.secure else ''}, C = {c}, "
          f"{args.rounds} rounds x H = {args.inner_steps}, {args.reps} rep(s); summary_clips = "
          f"{cfg.objective.summary_clips}, summary = {summary_numel(cfg):,} floats, global = {global_bytes:,} B")
    print(f"{'per round':<38} {'silo':>14} {'pooled':>14} {'pooled/silo':>13}")

    def row(label: str, a: list[float], b: list[float], fmt: str) -> float | None:
        if not a or not b:
            return None
        ma, mb = statistics.mean(a), statistics.mean(b)
        ratio = mb / ma if ma else float("nan")
        print(f"{label:<38} {format(ma, fmt):>14} {format(mb, fmt):>14} {ratio:>12.3f}x")
        return ratio

    s, p = results["silo"], results["pooled"]
    rb = row("bytes (fed/comm_bytes)", s["bytes"], p["bytes"], ",.0f")
    print(f"{'  of which the summary ask':<38} {'':>14} {format(statistics.mean(p['summary']), ',.0f'):>14}")
    # sending the global again in the train ask, as before the kept global: C more copies
    rw = row("bytes without the kept global", s["bytes"], [x + c * global_bytes for x in p["bytes"]], ",.0f")
    rp = row("bytes (protobuf messages)", s["proto"], p["proto"], ",.0f")
    rs = row("seconds (fed/round_seconds)", s["seconds"], p["seconds"], ".2f")
    ro = row("seconds beyond the slowest compute", s["overhead"], p["overhead"], ".2f")
    print(f"ratio pooled/silo bytes per round: {rb:.3f}x" + (f" (protobuf {rp:.3f}x)" if rp else "")
          + f"; without the kept global: {rw:.3f}x; seconds per round: {rs:.2f}x; "
          f"seconds beyond compute: {ro:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
