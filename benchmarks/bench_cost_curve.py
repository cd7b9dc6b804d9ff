"""Cost of a round against the number of participants C: seconds, bytes and coordinator memory.

For each C in ``--participants`` (default 2 4 8 16) the micro federation (``experiment=micro``,
``data.num_silos=C``) runs ``--rounds`` rounds on the ``ray`` engine, Flower's supported
simulation path (``run_with_flwr``: ``flwr run`` on a simulation SuperLink, C virtual clients as
Ray actors, one CPU each; a private Ray, or ``--ray-address`` for a running cluster). Data and a
throw-away warm start are prepared before the runs, so neither is in the round times.

Per C it prints, from the coordinator's own round metrics (``summary.json``):

* ``round s``: ``fed/round_seconds`` (sending the round to the last reply), median over the rounds
  after the first (round 0 also pays the actors' torch import) — and round 0 separately;
* ``close s``: ``fed/aggregate_seconds``, the coordinator's ``close_round`` (validation, the
  checked fp64 aggregation, the outer step, the global model's probe embedding, frame drift over
  all C(C-1)/2 participant pairs plus C against the global model);
* ``bytes``: ``fed/comm_bytes`` per round (global arrays down to each node, deltas and probe
  embeddings back, as the ServerApp counts them) and per participant;
* ``coord MiB``: the peak RSS (VmHWM) of the ``flwr-simulation`` process, which holds the
  ServerApp (the coordinator) and the Ray driver, sampled from /proc every 0.2 s;
* ``wall s``: the whole ``run_with_flwr`` call (SuperLink, FAB, Ray start, rounds, teardown).

Then least-squares fits: bytes = a + b·C (expected: linear, a ~ 0), round seconds = a + b·C,
close_round seconds = a + b·C + c·C², coordinator RSS = a + b·C. On a machine with fewer cores
than C the actors take turns (2 cores: C/2 waves), so round seconds grow ~linearly in C here; on a
cluster with a CPU per client they stay ~flat and only the coordinator's share grows.

``--coordinator`` adds the coordinator's two C-dependent pieces timed on synthetic inputs for
larger C, at the micro sizes and at the paper preset's sizes: ``aggregate_checked`` (O(C·n), n
federated floats) and ``frame_drift`` (O(C²) pairs of d x d Procrustes problems on the probe's
measurement frames; also with ``max_pairs`` sampling, which ``frame_drift`` offers and the
coordinator does not use yet). This says where they would start to dominate a round.

    nice -n 10 .venv/bin/python benchmarks/bench_cost_curve.py --coordinator      # C = 2 4 8 16, 2 rounds
    .venv/bin/python benchmarks/bench_cost_curve.py --participants 2 4 --rounds 2
    .venv/bin/python benchmarks/bench_cost_curve.py --coordinator-only

``--max-minutes`` (default 25) skips a C whose run, extrapolated from the previous C, would take
longer, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


# ------------------------------------------------------------------------------ memory sampler
def _status_kib(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class PeakRSS:
    """Samples this process's descendants: the peak VmHWM of ``flwr-simulation`` (coordinator +
    Ray driver) and the peak of the summed RSS of the Ray actors (``ray::ClientAppActor``)."""

    def __init__(self, period_s: float = 0.2):
        self.period_s, self.coordinator_kib, self.actors_kib = period_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        from lensemble.federation.flower.processes import descendants

        while not self._stop.is_set():
            actors = 0
            for pid in descendants(os.getpid()):
                cmd = _cmdline(pid)
                if "flwr-simulation" in cmd:
                    self.coordinator_kib = max(self.coordinator_kib, _status_kib(pid, "VmHWM") or 0)
                elif "ClientAppActor" in cmd:
                    actors += _status_kib(pid, "VmRSS") or 0
            self.actors_kib = max(self.actors_kib, actors)
            self._stop.wait(self.period_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


# ------------------------------------------------------------------------------ fits
def lstsq(xs, ys, degree: int) -> tuple[list[float], float]:
    """Coefficients (a, b[, c]) of a + b·x (+ c·x²) and the largest relative residual."""
    import numpy as np

    x = np.asarray(xs, float)
    a = np.vander(x, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(a, np.asarray(ys, float), rcond=None)
    fit = a @ coef
    rel = float(np.max(np.abs(fit - ys) / np.maximum(np.abs(ys), 1e-12)))
    return [float(c) for c in coef], rel


# ------------------------------------------------------------------------------ federation runs
def run_one(c: int, args, work: Path, ws_dir: str) -> dict:
    from lensemble.config import load_config
    from lensemble.data.store import ensure_data
    from lensemble.federation.flower.runtime import run_with_flwr

    cfg = load_config(["experiment=micro", f"data.num_silos={c}", f"federation.rounds={args.rounds}",
                       f"federation.inner_steps={args.inner_steps}", f"data.root={work / 'data'}",
                       f"run_dir={work / f'run-c{c}'}", f"federation.warmstart={ws_dir}", *args.overrides])
    t0 = time.perf_counter()
    ensure_data(cfg, progress=False)
    collect_s = time.perf_counter() - t0
    run_dir = work / f"run-c{c}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        summary = run_with_flwr(cfg, run_dir, progress=False, ray_address=args.ray_address)
    wall = time.perf_counter() - t0
    rounds = summary["rounds"]
    later = rounds[1:] or rounds
    row = {
        "C": c, "rounds": len(rounds), "collect_s": collect_s, "wall_s": wall,
        "round0_s": rounds[0]["fed/round_seconds"],
        "round_s": statistics.median(r["fed/round_seconds"] for r in later),
        "close_s": statistics.median(r["fed/aggregate_seconds"] for r in later),
        "compute_s": statistics.median(r["fed/max_compute_seconds"] for r in later),
        "bytes": statistics.median(r["fed/comm_bytes"] for r in rounds),
        "participants": min(r["fed/participants"] for r in rounds),
        "coord_mib": mem.coordinator_kib / 1024, "actors_mib": mem.actors_kib / 1024,
    }
    row["startup_s"] = wall - sum(r["fed/round_seconds"] + r["fed/aggregate_seconds"] for r in rounds)
    return row


def print_rows(rows: list[dict]) -> None:
    print(f"\n{'C':>3} {'rounds':>6} {'wall s':>7} {'startup s':>9} {'round0 s':>8} {'round s':>8} "
          f"{'close s':>8} {'bytes/round':>12} {'bytes/C':>10} {'coord MiB':>9} {'actors MiB':>10}")
    for r in rows:
        print(f"{r['C']:>3} {r['rounds']:>6} {r['wall_s']:>7.1f} {r['startup_s']:>9.1f} {r['round0_s']:>8.2f} "
              f"{r['round_s']:>8.2f} {r['close_s']:>8.3f} {r['bytes']:>12,.0f} {r['bytes'] / r['C']:>10,.0f} "
              f"{r['coord_mib']:>9.0f} {r['actors_mib']:>10.0f}")


def print_fits(rows: list[dict]) -> None:
    cs = [r["C"] for r in rows]
    if len(cs) < 2:
        return
    (a, b), rel = lstsq(cs, [r["bytes"] for r in rows], 1)
    print(f"\nfit bytes/round = {a:,.0f} + {b:,.0f}·C  (largest relative residual {rel:.2e})")
    (a, b), rel = lstsq(cs, [r["round_s"] for r in rows], 1)
    print(f"fit round s = {a:.2f} + {b:.3f}·C  (largest relative residual {rel:.1%})")
    if len(cs) >= 3:
        (a, b, c2), rel = lstsq(cs, [r["close_s"] for r in rows], 2)
        print(f"fit close_round s = {a:.3f} + {b:.4f}·C + {c2:.5f}·C²  (largest relative residual {rel:.1%})")
    else:
        (a, b), rel = lstsq(cs, [r["close_s"] for r in rows], 1)
        print(f"fit close_round s = {a:.3f} + {b:.4f}·C  (largest relative residual {rel:.1%})")
    (a, b), rel = lstsq(cs, [r["coord_mib"] for r in rows], 1)
    print(f"fit coordinator peak RSS MiB = {a:.0f} + {b:.2f}·C  (largest relative residual {rel:.1%})")
    share = [r["close_s"] / (r["round_s"] + r["close_s"]) for r in rows]
    print("coordinator share of a round (close / (round + close)): "
          + ", ".join(f"C={c}: {s:.1%}" for c, s in zip(cs, share, strict=True)))


# ------------------------------------------------------------------------------ coordinator pieces
def coordinator_pieces(label: str, n: int, d: int, m: int, cs: list[int], max_agg_c: int, reps: int) -> None:
    """Time aggregate_checked (C deltas of n floats) and frame_drift (C + global embeddings (m, d))."""
    import torch

    from lensemble.federation.outer import aggregate_checked
    from lensemble.gauge.drift import frame_drift

    print(f"\n[{label}] n = {n:,} federated floats, probe measurement frames m = {m}, d = {d}")
    print(f"  {'C':>4} {'pairs':>6} {'aggregate s':>11} {'drift s':>9} {'drift s (64 pairs)':>18} {'per pair ms':>11}")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(m, d, generator=g, dtype=torch.float64)
    for c in cs:
        agg = None
        if c <= max_agg_c:
            deltas = {f"silo-{i}": {"w": torch.randn(n, generator=g)} for i in range(c)}
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                aggregate_checked(deltas)
                times.append(time.perf_counter() - t0)
            agg = min(times)
            del deltas
        emb = {f"silo-{i}": (base @ torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
                             + 0.01 * torch.randn(m, d, generator=g, dtype=torch.float64)).float() for i in range(c)}
        emb["global"] = base.float()
        t0 = time.perf_counter()
        frame_drift(emb, singular_floor=1e-10)
        drift = time.perf_counter() - t0
        sampled = None
        pairs = c * (c - 1) // 2
        if pairs > 64:
            t0 = time.perf_counter()
            frame_drift(emb, singular_floor=1e-10, max_pairs=64)
            sampled = time.perf_counter() - t0
        per_pair = 1000 * drift / max(pairs + c, 1)
        print(f"  {c:>4} {pairs:>6} {'-' if agg is None else f'{agg:.3f}':>11} {drift:>9.3f} "
              f"{'-' if sampled is None else f'{sampled:.3f}':>18} {per_pair:>11.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--participants", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--inner-steps", type=int, default=3, help="H (experiment=micro: 3)")
    ap.add_argument("--ray-address", default=None, help="run on this Ray cluster instead of a private Ray")
    ap.add_argument("--max-minutes", type=float, default=25.0,
                    help="skip a C whose run, extrapolated from the previous C, would take longer")
    ap.add_argument("--coordinator", action="store_true", help="also time aggregation and drift on synthetic inputs")
    ap.add_argument("--coordinator-only", action="store_true")
    ap.add_argument("--workdir", default="/tmp/lensemble-bench-cost-curve")
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides laid over experiment=micro")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"cost curve: experiment=micro, {args.rounds} rounds x H={args.inner_steps}, C = {args.participants}, "
          f"{'cluster ' + args.ray_address if args.ray_address else 'private Ray'}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    rows: list[dict] = []
    if not args.coordinator_only:
        from lensemble.config import load_config
        from lensemble.training.warmstart import train_warmstart

        t0 = time.perf_counter()
        ws_cfg = load_config(["experiment=micro", f"data.root={work / 'data'}", f"run_dir={work / 'ws'}",
                              *args.overrides])
        ws_dir = work / "ws" / "warmstart"
        if not (ws_dir / "result.json").exists():
            train_warmstart(ws_cfg, run_dir=ws_dir, progress=False)
        ws = json.loads((ws_dir / "result.json").read_text())["checkpoint"]
        print(f"setup: warm start in {time.perf_counter() - t0:.1f} s", flush=True)
        for c in args.participants:
            if rows:
                prev = rows[-1]
                rounds_part = prev["wall_s"] - prev["startup_s"]
                estimate = (prev["startup_s"] + rounds_part * c / prev["C"]) / 60
                if estimate > args.max_minutes:
                    print(f"C={c}: skipped, extrapolated {estimate:.0f} min > --max-minutes {args.max_minutes:g} "
                          f"(from C={prev['C']}: startup {prev['startup_s']:.0f} s + rounds x {c}/{prev['C']})",
                          flush=True)
                    continue
            row = run_one(c, args, work, ws)
            rows.append(row)
            print(f"C={c}: {row['participants']}/{c} replies, wall {row['wall_s']:.1f} s, round {row['round_s']:.2f} s, "
                  f"close {row['close_s']:.3f} s, {row['bytes']:,.0f} B/round, coordinator {row['coord_mib']:.0f} MiB "
                  f"(collect {row['collect_s']:.1f} s, load {os.getloadavg()[0]:.1f})", flush=True)
        print_rows(rows)
        print_fits(rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.coordinator or args.coordinator_only:
        from lensemble.config import load_config
        from lensemble.data.probe import landmark_count
        from lensemble.federation.state import federated_keys
        from lensemble.model.world_model import build_world_model

        for preset, max_agg_c in (("micro", 256), ("paper", 16)):
            cfg = load_config([f"experiment={preset}"])
            keys = federated_keys(cfg)
            n = sum(v.numel() for k, v in build_world_model(cfg.model, init_seed=0).state_dict().items() if k in keys)
            p = cfg.data.probe_frames
            m = p - landmark_count(p, cfg.gauge.anchor_landmarks)
            coordinator_pieces(preset, n, cfg.model.latent_dim, m, [2, 4, 8, 16, 32, 64, 128], max_agg_c, reps=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
