"""Benchmark: what ``frame_drift(degenerate="mask")`` costs, against the raising mode in the same run.

The coordinator measures every round with ``degenerate="mask"``. On identifiable embeddings it must
cost what the raising mode costs (same path, same bits: checked). When some participants' latents
have dead directions, the batch that holds a degenerate pair takes one extra batched SVD (which
items are degenerate, their polar factors and the subspace ambiguity bound); the reference there
is the same report on the healthy participants alone, so the ratio is the price of measuring the
degenerate ones instead of losing the round.

    .venv/bin/python benchmarks/bench_drift_mask.py            # C=8 participants + global, d=64, |P|=128
    .venv/bin/python benchmarks/bench_drift_mask.py -C 32 --reps 5

Measured on the shared 2-core host with the room study running (d=64, |P|=128, 5 reps, 2 dead):
  C=8:  identifiable 32.0 ms raise vs 30.7 ms mask (0.96x, reports identical); with the dead
        participants 71.2 ms for 36 pairs (15 degenerate) against 36.4 ms for the 21 healthy ones (1.96x).
  C=32: 471.0 vs 477.1 ms (1.01x, identical); 577.5 ms for 528 pairs (63 degenerate) against
        443.9 ms for 465 (1.30x). Every participant's subspace angle to the global was measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lensemble.gauge.drift import frame_drift


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--participants", "-C", type=int, default=8)
    p.add_argument("--dim", "-d", type=int, default=64)
    p.add_argument("--probe", "-P", type=int, default=128, help="measurement frames (the room study: 128)")
    p.add_argument("--dead", type=int, default=2, help="participants whose latents have dead directions")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def _embeddings(c: int, d: int, n: int, dead: int, seed: int) -> dict[str, torch.Tensor]:
    """c rotated copies of one cloud (strong 12 directions, weak rest at 1e-2) plus a global;
    the first ``dead`` participants' weak directions are scaled to 1e-9 (below the 1e-10 floor
    once squared in the cross-covariance)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, d, generator=g, dtype=torch.float64)
    base[:, 12:] *= 1e-2
    out = {"global": base.clone()}
    for i in range(c):
        q, _ = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64))
        x = base.clone()
        x[:, :12] = x[:, :12] @ q
        x[:, 12:] = torch.randn(n, d - 12, generator=g, dtype=torch.float64) * (1e-9 if i < dead else 1e-2)
        out[f"site-{i:03d}"] = x
    return out


def _time(fn, reps: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(reps):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def main() -> int:
    a = _parse()
    torch.set_num_threads(1)
    emb = _embeddings(a.participants, a.dim, a.probe, a.dead, a.seed)
    dead = {f"site-{i:03d}" for i in range(a.dead)}
    healthy = {k: v for k, v in emb.items() if k not in dead}
    kw = {"singular_floor": 1e-10, "workers": 1}

    raise_s, raised = _time(lambda: frame_drift(healthy, **kw), a.reps)
    mask_s, masked = _time(lambda: frame_drift(healthy, degenerate="mask", **kw), a.reps)
    same = raised.model_dump_json() == masked.model_dump_json()
    print(f"identifiable ({len(healthy) - 1} participants + global): raise {raise_s * 1e3:.1f} ms, "
          f"mask {mask_s * 1e3:.1f} ms, ratio mask/raise {mask_s / raise_s:.2f}; reports identical: {same}")

    dead_s, report = _time(lambda: frame_drift(emb, degenerate="mask", **kw), a.reps)
    healthy_s, _ = _time(lambda: frame_drift(healthy, degenerate="mask", **kw), a.reps)
    pairs = len(report.pairwise_angle_deg) + len(report.drift_from_global)
    print(f"with {a.dead} dead-direction participants ({len(report.degenerate_pairs)} of {pairs} pairs degenerate): "
          f"mask {dead_s * 1e3:.1f} ms against {healthy_s * 1e3:.1f} ms for the healthy ones alone "
          f"(ratio {dead_s / healthy_s:.2f}, for {pairs} pairs instead of "
          f"{len(masked.pairwise_angle_deg) + len(masked.drift_from_global)})")
    sub = [v.subspace_angle_deg for v in report.drift_from_global.values()]
    print(f"subspace angles to the global: {sum(s is not None for s in sub)} of {len(sub)} measured")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
