"""Federation engines: per-round framework overhead and bytes per round against the codec's prediction.

Runs a few real DiLoCo rounds (``Coordinator`` + ``participant_round``) with C = ``data.num_silos``
participants on each engine:

* ``inprocess`` - :func:`lensemble.federation.inprocess.run_inprocess`: no Flower, participants
  run one after another in this process;
* ``flower``    - :func:`lensemble.federation.simulation.run_on_local_grid`: the real ServerApp / ClientApp on
  Flower's message layer (``LocalGrid``: a protobuf round trip per message, one thread per node,
  so the C participants run concurrently);
* ``ray``       - :func:`lensemble.federation.flower.runtime.run_with_flwr` (only with ``--ray``; start-up is
  outside the rounds and not counted).

**Overhead.** Participants report ``fed/compute_seconds`` (their whole ``participant_round``: load
the global weights, H inner steps, probe embeddings, pseudo-gradient, encoding); the coordinator
records ``fed/round_seconds`` (from sending the round to having every reply, i.e. before
``close_round``) and ``fed/max_compute_seconds``. Framework overhead per round =
``round_seconds - max_compute_seconds`` and its share = overhead / round_seconds (goal <= 5 %).
The in-process engine runs participants sequentially, so its round takes about C x one
participant by construction; for it the script also prints ``round - sum(compute)``, the
engine's own overhead. ``close_round`` (aggregation, drift, checkpoint commit) is Lensemble's
coordinator work, not framework overhead; it is printed separately (``agg``).

**Bytes.** n = number of float entries the pseudo-gradient payload carries (the trainable
parameters; fixed buffers such as the input standardisation are sent downlink only). The codec predicts
4n bytes per participant for fp32 and n + 4 for int8 (``federation.quantize_int8=true``). Two
definitions of "bytes per round" are printed, each measured against its prediction:

* ``uplink delta``: the pseudo-gradient payloads only, C x (4n | n + 4) - the codec's claim.
  Flower: the ``delta`` records' serialised bytes (``np.save`` bytes, 128-byte header per array)
  as the ServerApp counts them on receipt; in-process: ``fed/comm_bytes`` (raw payload bytes).
* ``both directions``: ``fed/comm_bytes`` as the ServerApp records it - global arrays sent to
  every node (4n each, one ``np.save`` header per tensor) plus every reply's delta and public
  probe embeddings (4 |P| d) - against C x (4n + delta + 4 |P| d). For the Flower grid the
  protobuf-serialised message sizes (framing, round config with the resolved config JSON and
  metrics included) are printed as well.

Sizes: by default the default config (CPU-preset model, batch 64, S = 512, C = 2) with
``experiment=micro``-sized silo data and a short inner loop (``--inner-steps 5``: one CPU-preset
step costs ~0.5-2 s on 2 shared cores, and fewer inner steps make the overhead share larger, i.e.
the check stricter). ``--small`` uses ``experiment=micro`` for everything. The int8 byte check
runs one round with one inner step per engine. A throw-away warm start (``--warmstart-steps``)
is trained once and shared. Scratch output goes under ``--workdir`` (default /tmp).

    .venv/bin/python benchmarks/bench_federation.py                 # CPU preset, 3 rounds x 5 inner steps
    .venv/bin/python benchmarks/bench_federation.py --small         # micro everything, seconds
    .venv/bin/python benchmarks/bench_federation.py --ray --rounds 2 --inner-steps 10
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

OVERHEAD_GOAL = 0.05
BYTES_GOAL = 0.01
# experiment=micro's silo data (configs/experiment/micro.yaml), laid over the default config.
MICRO_DATA = ["data.episodes_per_silo=4", "data.steps_per_episode=30", "data.heldout_episodes=1",
              "data.probe_frames=32", "data.public_episodes=4", "data.workers=1"]


# ------------------------------------------------------------------------------ instrumentation
class Probe:
    """Wraps the coordinator's ``close_round`` and the Flower byte counters (this process only:
    the ServerApp runs here for every engine; participants are untouched)."""

    def __init__(self):
        self.rounds: list[dict] = []
        self._pending = self._fresh()

    @staticmethod
    def _fresh() -> dict:
        return {"delta_bytes": [], "probe_bytes": [], "proto_down": 0, "proto_up": 0}

    def install(self):
        from lensemble.federation.coordinator import Coordinator
        from lensemble.federation.flower import local_grid, records, transport

        probe = self
        orig_close = Coordinator.close_round

        def close_round(coord, t, replies, failures, *args, **kwargs):
            started = time.perf_counter()
            out = orig_close(coord, t, replies, failures, *args, **kwargs)
            entry = dict(probe._pending)
            entry.update(round=t, close_seconds=time.perf_counter() - started,
                         compute=sorted(float(r.metrics.get("fed/compute_seconds", 0.0)) for r in replies.values()),
                         metrics=dict(out))
            probe.rounds.append(entry)
            probe._pending = probe._fresh()
            return out

        def reply_nbytes(content):  # ... and this for every reply it receives
            probe._pending["delta_bytes"].append(records.record_nbytes(content[records.DELTA]))
            probe._pending["probe_bytes"].append(records.record_nbytes(content[records.PROBE]))
            return records.reply_nbytes(content)

        def wire_copy(msg):  # LocalGrid's protobuf round trip, sized
            proto = local_grid.message_to_proto(msg)
            key = "proto_up" if msg.metadata.reply_to_message_id else "proto_down"
            probe._pending[key] += proto.ByteSize()
            return local_grid.message_from_proto(proto)

        Coordinator.close_round = close_round
        transport.reply_nbytes = reply_nbytes
        local_grid._wire_copy = wire_copy

    def take(self) -> list[dict]:
        out, self.rounds, self._pending = self.rounds, [], self._fresh()
        return out


# ------------------------------------------------------------------------------ running
def run_engine(engine: str, cfg, run_dir: Path) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    from lensemble.federation.simulation import run_federated_simulation

    names = {"inprocess": "inprocess", "flower": "flower-inprocess", "ray": "ray"}
    run_federated_simulation(cfg, run_dir, engine=names[engine], progress=False)


def pct(x: float) -> str:
    return f"{x:+.3%}"


def report_overhead(engine: str, rounds: list[dict]) -> tuple[float, float | None]:
    seq = engine == "inprocess"
    print(f"\n[{engine}] per round (seconds): round = fed/round_seconds, agg = close_round (not counted)")
    print(f"  {'t':>2} {'round':>8} {'max comp':>9} {'sum comp':>9} {'overhead':>9} {'share':>8}"
          + (f" {'round-sum':>10} {'share':>8}" if seq else "") + f" {'agg':>7}")
    shares, seq_shares = [], []
    for r in rounds:
        m = r["metrics"]
        rnd, mx, sm = m["fed/round_seconds"], m["fed/max_compute_seconds"], sum(r["compute"])
        ov = rnd - mx
        shares.append(ov / rnd)
        line = f"  {r['round']:>2} {rnd:>8.2f} {mx:>9.2f} {sm:>9.2f} {ov:>9.3f} {ov / rnd:>8.2%}"
        if seq:
            seq_shares.append((rnd - sm) / rnd)
            line += f" {rnd - sm:>10.3f} {(rnd - sm) / rnd:>8.2%}"
        print(line + f" {r['close_seconds']:>7.2f}")
    med = statistics.median(shares)
    verdict = "OK" if med <= OVERHEAD_GOAL else "ABOVE GOAL"
    if seq:
        seq_med = statistics.median(seq_shares)
        print(f"overhead share {engine}: median {med:.2%} of the round (round - max compute; goal <= "
              f"{OVERHEAD_GOAL:.0%}) {verdict}; sequential engine, round - sum(compute): median {seq_med:.2%}")
    else:
        print(f"overhead share {engine}: median {med:.2%} of the round (round - max compute; goal <= "
              f"{OVERHEAD_GOAL:.0%}) {verdict}")
    return med, (statistics.median(seq_shares) if seq else None)


def report_bytes(engine: str, codec: str, rounds: list[dict], *, c: int, n: int, n_global: int,
                 probe_bytes: int) -> None:
    delta_pred = 4 * n if codec == "fp32" else n + 4
    print(f"\n[{engine} {codec}] bytes per round: measured vs predicted (relative difference)")
    up_diffs, both_diffs = [], []
    for r in rounds:
        comm = int(r["metrics"]["fed/comm_bytes"])
        if engine == "inprocess":  # fed/comm_bytes = the replies' raw payload bytes, nothing else
            up_pred = c * delta_pred
            up_diffs.append((comm - up_pred) / up_pred)
            print(f"  round {r['round']}: uplink delta (fed/comm_bytes) {comm:,} B vs C x "
                  f"{'4n' if codec == 'fp32' else '(n+4)'} = {up_pred:,} B ({pct(up_diffs[-1])})")
            continue
        up, probe_up = sum(r["delta_bytes"]), sum(r["probe_bytes"])
        up_pred = len(r["delta_bytes"]) * delta_pred
        down = comm - up - probe_up  # what the ServerApp counted as sent: the global arrays per node
        both_pred = c * (4 * n_global + delta_pred + probe_bytes)
        up_diffs.append((up - up_pred) / up_pred)
        both_diffs.append((comm - both_pred) / both_pred)
        print(f"  round {r['round']}: uplink delta {up:,} B vs {up_pred:,} B ({pct(up_diffs[-1])}) | "
              f"both directions (fed/comm_bytes) {comm:,} B vs C x (4n + delta + 4|P|d) = {both_pred:,} B "
              f"({pct(both_diffs[-1])}): down {down:,} + up delta {up:,} + up probe {probe_up:,}")
        if r["proto_down"] or r["proto_up"]:
            proto = r["proto_down"] + r["proto_up"]
            print(f"           protobuf messages (framing, config JSON, metrics included): down "
                  f"{r['proto_down']:,} B, up {r['proto_up']:,} B, total {proto:,} B "
                  f"({pct((proto - both_pred) / both_pred)} vs the array prediction)")
    worst = max(up_diffs, key=abs)
    line = f"bytes {engine} {codec}: uplink delta rel diff {pct(worst)}"
    if both_diffs:
        line += f"; both directions rel diff {pct(max(both_diffs, key=abs))}"
    ok = abs(worst) <= BYTES_GOAL
    print(line + f" (worst round; goal: uplink delta within {BYTES_GOAL:.0%}) {'OK' if ok else 'MISSED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="experiment=micro for everything")
    ap.add_argument("--rounds", type=int, default=None, help="federated rounds (default 3, --small 2)")
    ap.add_argument("--inner-steps", type=int, default=None, help="H (default 5, --small 3)")
    ap.add_argument("--warmstart-steps", type=int, default=2, help="throw-away warm start steps")
    ap.add_argument("--ray", action="store_true", help="also run Flower's Ray simulation engine")
    ap.add_argument("--engines", nargs="+", default=None, choices=["inprocess", "flower", "ray"])
    ap.add_argument("--no-int8", action="store_true", help="skip the int8 byte check")
    ap.add_argument("--workdir", default="/tmp/lensemble-bench-federation",
                    help="scratch folder (data kept for reuse; runs replaced)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = ap.parse_args()

    from lensemble.config import load_config
    from lensemble.federation.state import federated_keys
    from lensemble.model import build_world_model
    from lensemble.training.warmstart import train_warmstart

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rounds = args.rounds or (2 if args.small else 3)
    inner = args.inner_steps or (3 if args.small else 5)
    base = (["experiment=micro"] if args.small else MICRO_DATA) + [
        f"data.root={work / 'data'}", f"run_dir={work / 'runs'}", f"train.warmstart_steps={args.warmstart_steps}",
        f"federation.rounds={rounds}", f"federation.inner_steps={inner}"] + list(args.overrides)
    cfg = load_config(base)
    engines = args.engines or (["inprocess", "flower"] + (["ray"] if args.ray else []))

    t0 = time.perf_counter()
    ws = train_warmstart(cfg, run_dir=work / "runs" / "warmstart", progress=False)
    print(f"setup: data + warm start ({args.warmstart_steps} steps) in {time.perf_counter() - t0:.1f} s "
          f"under {work}", flush=True)
    base.append(f"federation.warmstart={ws.checkpoint_dir}")
    cfg = load_config(base)

    model = build_world_model(cfg.model, init_seed=0)
    # Uplink: only the federated (trainable) parameters travel as a pseudo-gradient; downlink: the
    # whole global state, fixed input-standardisation buffers included.
    keys = federated_keys(cfg)
    n = sum(v.numel() for k, v in model.state_dict().items() if k in keys)
    n_global = sum(v.numel() for v in model.state_dict().values() if v.is_floating_point())
    c, p, d = cfg.data.num_silos, cfg.data.probe_frames, cfg.model.latent_dim
    m, tr = cfg.model, cfg.train
    print(f"{'micro' if args.small else 'CPU preset'}: {m.img_size}px, embed {m.embed_dim}, depth {m.depth}, "
          f"d {d}; batch {tr.batch_size}, S {cfg.objective.sigreg_directions}; C={c} participants, "
          f"{rounds} rounds x H={inner} inner steps; |P|={p}", flush=True)
    print(f"n = {n:,} federated floats in the payload (of {n_global:,} in the global state: "
          f"{n_global - n:,} fixed buffers travel downlink only); predicted per participant: "
          f"fp32 4n = {4 * n:,} B, int8 n+4 = {n + 4:,} B; probe embeddings 4|P|d = {4 * p * d:,} B",
          flush=True)

    probe = Probe()
    probe.install()
    shares: dict[str, tuple[float, float | None]] = {}
    results: dict[tuple[str, str], list[dict]] = {}
    for engine in engines:
        t0 = time.perf_counter()
        run_engine(engine, cfg, work / "runs" / f"{engine}-fp32")
        results[(engine, "fp32")] = probe.take()
        print(f"\n== {engine}: {rounds} rounds in {time.perf_counter() - t0:.1f} s wall (incl. set-up)", flush=True)
        shares[engine] = report_overhead(engine, results[(engine, "fp32")])
        sys.stdout.flush()
    if not args.no_int8:
        cfg8 = load_config(base + ["federation.quantize_int8=true", "federation.rounds=1", "federation.inner_steps=1"])
        for engine in [e for e in engines if e != "ray"]:
            run_engine(engine, cfg8, work / "runs" / f"{engine}-int8")
            results[(engine, "int8")] = probe.take()

    for (engine, codec), rs in results.items():
        report_bytes(engine, codec, rs, c=c, n=n, n_global=n_global, probe_bytes=4 * p * d)

    print("\nsummary")
    for engine, (share, seq) in shares.items():
        extra = f"; round - sum(compute), the sequential engine's own cost: {seq:.2%}" if seq is not None else ""
        print(f"  overhead share {engine}: round - max compute {share:.2%} (goal <= {OVERHEAD_GOAL:.0%}){extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
