"""Training replicates in the analysis: the three-level bootstrap (seeds, replicates, tasks).

With ``replicates: R`` in a study preset every trained arm runs R times per seed, the runs
differing only in their batch order (``train.replicate``, docs/study.md "Replicates"). One run
per seed cannot show how much a result moves when the same experiment is trained again; R runs
can, and every interval the analysis reports for success differences and for ρ then resamples

1. the seeds, with replacement (every arm keeps the seed drawn: warm start, silos, tasks);
2. within each drawn seed, each arm's replicates, with replacement and independently across
   arms (the replicate index pairs nothing: replicate 1 of two arms are two unrelated runs);
3. within each drawn seed, the seed's evaluation tasks, with replacement, one draw shared by
   every arm and replicate (they all played the same tasks: a task easy for one run is easy
   for the others, and that pairing is kept).

A seed's unit here is a list of 2-D arrays, one per arm, of shape (replicates, tasks): the 0/1
outcome of each replicate on each task of the seed, or, when the runs recorded no episodes, the
success rates as one column (then step 3 draws nothing). The estimate of an arm is the mean over
seeds of its replicate-mean success, which is what the t test's unit (the seed) sees.

Resampling every level counts the inner levels' variance twice (once in the seed means, once
resampled again), so at many seeds the interval is a little conservative; at few seeds that
extra width offsets the percentile bootstrap's narrowness over seeds. The known-answer test
(tests/unit/test_study_replicates.py) measures its coverage, and the under-coverage of a
bootstrap over tasks alone, on a simulated study whose true ρ and difference are known.
"""

from __future__ import annotations

import numpy as np

from lensemble.errors import EvaluationError
from lensemble.eval.stats import as_rng


def nested_bootstrap(units, *, n_boot: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """(n_boot, n_arms) bootstrap replicates of every arm's mean over seeds of its replicate-mean
    success, resampling seeds, then each arm's replicates, then the seed's tasks (module doc).

    Args:
        units: one entry per seed, each a list (one per arm, the same arms in every seed) of
            arrays (replicates, tasks); all arms of a seed have the same number of tasks.
    """
    units = [[np.atleast_2d(np.asarray(y, float)) for y in arms] for arms in units]
    n = len(units)
    if n < 2:
        raise EvaluationError(f"the replicate bootstrap needs at least 2 seeds, got {n}",
                              remediation="run the study on more seeds")
    k = len(units[0])
    if any(len(arms) != k for arms in units):
        raise EvaluationError("every seed needs the same arms for the replicate bootstrap")
    for s, arms in enumerate(units):
        if len({y.shape[1] for y in arms}) != 1 or any(y.shape[0] < 1 or y.shape[1] < 1 for y in arms):
            raise EvaluationError(f"seed {s}: every arm needs >= 1 replicate and the seed's same tasks, got "
                                  f"shapes {[y.shape for y in arms]}",
                                  remediation="evaluate every replicate of every arm on the seed's episodes")
    if n_boot < 100:
        raise EvaluationError(f"n_boot must be at least 100, got {n_boot}")
    rng = as_rng(seed)
    picks = rng.integers(0, n, size=(n_boot, n))
    out = np.zeros((n_boot, k))
    for s, arms in enumerate(units):
        rows = np.nonzero(picks == s)[0]     # one entry per (bootstrap replicate, slot) that drew seed s
        m = rows.size
        if not m:
            continue
        tasks = _draw_weights(rng, m, arms[0].shape[1])   # one task resample per slot, shared by every arm
        for a, y in enumerate(arms):
            reps = _draw_weights(rng, m, y.shape[0])      # each arm's own replicate resample
            val = np.einsum("mr,rk,mk->m", reps, y, tasks)
            out[:, a] += np.bincount(rows, weights=val, minlength=n_boot)
    return out / n


def _draw_weights(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """(m, k): row i the frequencies of k draws with replacement from k items (sums to 1)."""
    if k == 1:
        return np.ones((m, 1))
    picks = rng.integers(0, k, size=(m, k))
    return np.bincount((np.arange(m)[:, None] * k + picks).ravel(), minlength=m * k).reshape(m, k) / k


def point_estimate(units) -> np.ndarray:
    """Every arm's mean over seeds of its replicate-mean success (the bootstrap's centre)."""
    return np.array([[float(np.mean(np.asarray(y, float))) for y in arms] for arms in units]).mean(0)


def replicate_count(per_seed: dict[int, dict]) -> int:
    """The largest number of replicates any seed of one arm's per-seed values holds (1 without)."""
    return max((len(v.get("replicates") or [v]) for v in per_seed.values()), default=1)


def has_replicates(*arms: dict[int, dict]) -> bool:
    """Whether any seed of any of these arms holds more than one training replicate."""
    return any(replicate_count(a) > 1 for a in arms)


def seed_units(arms: list[dict[int, dict]], seeds: list[int]) -> tuple[list[list[np.ndarray]], str]:
    """The bootstrap units of ``seeds`` for ``arms`` (per-seed values, replicates under
    ``"replicates"``) and the levels resampled: per-task outcomes where every replicate of every
    arm of every seed recorded the seed's same episodes, success rates otherwise."""
    def reps(v: dict) -> list[dict]:
        return [x for x in (v.get("replicates") or [v]) if x.get("success") is not None]

    def episodes_ok(s: int) -> bool:
        runs = [x for a in arms for x in reps(a[s])]
        eps = [x.get("episodes") for x in runs]
        return (bool(runs) and all(e is not None for e in eps) and len({x.get("goal_spec_hash") for x in runs}) == 1
                and len({frozenset(e) for e in eps}) == 1)

    with_tasks = all(episodes_ok(s) for s in seeds)
    units = []
    for s in seeds:
        row = []
        for a in arms:
            rs = reps(a[s])
            if with_tasks:
                keys = sorted(rs[0]["episodes"])
                row.append(np.array([[x["episodes"][key] for key in keys] for x in rs], float))
            else:
                row.append(np.array([[x["success"]] for x in rs], float))
        units.append(row)
    return units, ("seeds, replicates, paired episodes" if with_tasks else "seeds, replicates")


__all__ = ["has_replicates", "nested_bootstrap", "point_estimate", "replicate_count", "seed_units"]
