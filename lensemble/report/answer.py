"""The words a run report ends with, derived from its numbers by fixed rules.

Every sentence here is built from counts, intervals and per-round metrics by a rule that a test
checks; nothing is phrased by hand per result.

**Success comparisons** (:func:`compare_success`). Two success counts on the same n episodes are
compared by a 95 % interval of their difference:

* **paired** (:func:`lensemble.eval.stats.compare_paired_proportions`, Newcombe 1998's method 10)
  when the per-episode outcomes of the same tasks are known: the run's arms are evaluated on one
  goal-spec hash and eval seed, so episode i is the same task for both, and the interval uses the
  correlation of the two models' outcomes on a task (:func:`paired_outcomes` decides);
* **unpaired** otherwise (old reports without episode records, other tasks): Newcombe's hybrid
  score interval (:func:`lensemble.eval.stats.compare_proportions`, built from the two Wilson
  intervals), which treats the two models' episodes as independent samples.

The rule is the same for both:

* the interval lies entirely above 0 -> ``"better"``;
* entirely below 0 -> ``"worse"``;
* otherwise (it contains 0) -> ``"indistinguishable"``: the words say "not distinguishable ... at
  this n", never better or worse, whatever the point estimates.

How each errs: outcomes of two models on the same task are usually positively correlated, which
the unpaired interval ignores, so it is too wide there (it over-covers) and errs towards
"indistinguishable"; the paired interval is close to nominal coverage and narrower exactly by the
correlation the outcomes show, so it says "better" or "worse" at a smaller difference. With no
correlation (φ = 0) the two coincide. :func:`smallest_resolvable_difference` stays the unpaired,
conservative bound.

**Gap recovery** (:func:`gap_sentence`, with ``lensemble run --baselines``). ρ is named with its
interval only when the 95 % interval of S_twin − S_local excludes 0; otherwise the words say the
gap is not distinguishable from 0 and ρ undefined, whatever the point estimates.

**Drift** (:func:`drift_sentence`) leads with the variance-weighted measures; the full-space
geodesic angle is left to the report's tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from lensemble.errors import EvaluationError
from lensemble.eval.reports import EvalReport, pair_episodes
from lensemble.eval.stats import compare_paired_proportions, compare_proportions, wilson_interval
from lensemble.observability.progress import format_bytes  # re-exported for run_report
from lensemble.study.gap import GapRecovery

Reading = Literal["better", "worse", "indistinguishable"]


@dataclass(frozen=True)
class SuccessComparison:
    """``a − b`` of two success rates: the difference, its 95 % interval, the reading, and which
    interval (``"newcombe-paired"`` or ``"newcombe-hybrid-score"``, the unpaired one)."""

    a: str
    b: str
    difference: float
    ci: tuple[float, float]
    reading: Reading
    interval: str = "newcombe-hybrid-score"


def reading_of(ci: tuple[float, float]) -> Reading:
    """The rule: above 0 -> better, below 0 -> worse, containing 0 -> indistinguishable."""
    low, high = ci
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "indistinguishable"


Outcomes = tuple[Sequence[bool], Sequence[bool]]


def compare_success(a: str, k_a: int, n_a: int, b: str, k_b: int, n_b: int, *,
                    outcomes: Outcomes | None = None) -> SuccessComparison:
    """Compare ``k_a/n_a`` (model ``a``) with ``k_b/n_b`` (``b``) by the module's rule.

    ``outcomes``: optional per-episode successes ``(a's, b's)`` of the same tasks, each of
    length n_a == n_b, entry i being task i for both; given, the interval is the paired one,
    otherwise (or when n_a != n_b) the unpaired hybrid score interval. Outcomes that disagree with
    the counts raise EvaluationError.
    """
    if outcomes is not None and int(n_a) == int(n_b):
        oa, ob = (list(o) for o in outcomes)
        if (len(oa), len(ob), sum(map(bool, oa)), sum(map(bool, ob))) != (n_a, n_b, k_a, k_b):
            raise EvaluationError(f"per-episode outcomes ({sum(map(bool, oa))}/{len(oa)}, "
                                  f"{sum(map(bool, ob))}/{len(ob)}) disagree with the counts "
                                  f"({k_a}/{n_a}, {k_b}/{n_b})")
        cmp = compare_paired_proportions(oa, ob)
    else:
        cmp = compare_proportions(int(k_a), int(n_a), int(k_b), int(n_b))
    ci = (float(cmp.ci.low), float(cmp.ci.high))
    return SuccessComparison(a, b, float(cmp.difference), ci, reading_of(ci), cmp.ci.method)


def paired_outcomes(a: EvalReport, b: EvalReport) -> tuple[tuple[bool, ...], tuple[bool, ...]] | None:
    """Per-episode successes ``(a's, b's)`` of two reports, task i in both at position i (sorted
    by episode index), when they pair: both recorded their episodes, as many, on the same
    ``goal_spec_hash``. Otherwise None (e.g. a report written before episodes were kept), and the
    comparison falls back to the unpaired interval."""
    if a.episodes is None or b.episodes is None or len(a.episodes) != len(b.episodes):
        return None
    if a.goal_spec_hash != b.goal_spec_hash:
        return None
    pairs = pair_episodes(a, b)  # same tasks: records naming different episodes are an error
    return tuple(x.success for x, _ in pairs), tuple(y.success for _, y in pairs)


def pct(x: float) -> str:
    """A rate as a whole percentage without the sign: 0.3 -> "30"."""
    return f"{100 * x:.0f}"


def rate_text(k: int, n: int) -> str:
    """``6/20 = 30 % [15, 52]`` (95 % Wilson, whole percent)."""
    ci = wilson_interval(int(k), int(n))
    return f"{k}/{n} = {pct(k / n)} % [{pct(ci.low)}, {pct(ci.high)}]"


def points_text(c: SuccessComparison) -> str:
    """``+20 points [2, 38]``: the difference in percentage points with its interval."""
    return f"{100 * c.difference:+.0f} points [{100 * c.ci[0]:+.0f}, {100 * c.ci[1]:+.0f}]"


def success_sentence(label: str, counts: Mapping[str, tuple[int, int]], floors: Sequence[str],
                     outcomes: Mapping[str, Sequence[bool]] | None = None) -> str:
    """The headline: ``label``'s success against each floor, with the rule's reading.

    ``counts`` maps names (``label`` and every floor) to (successes, episodes), e.g.
    ``success_sentence("the federated model", {"the federated model": (6, 20), "random actions":
    (2, 20), "the warm start": (5, 20)}, ["random actions", "the warm start"])``.
    ``outcomes`` optionally maps names to per-episode successes on the same tasks (entry i the
    same task for every name); a floor is compared by the paired interval when it and ``label``
    both have them, by the unpaired one otherwise.
    """
    k, n = counts[label]
    outcomes = outcomes or {}

    def pair(f: str) -> Outcomes | None:
        return (outcomes[label], outcomes[f]) if label in outcomes and f in outcomes else None

    against = " and ".join(f"{counts[f][0]}/{counts[f][1]} for {f}" for f in floors)
    comparisons = [compare_success(label, k, n, f, *counts[f], outcomes=pair(f)) for f in floors]
    parts = []
    for reading in ("better", "worse"):
        for c in (c for c in comparisons if c.reading == reading):
            parts.append(f"{reading} than {c.b} ({points_text(c)})")
    # the interval is said here too: "not distinguishable" alone would hide how large a difference
    # the tasks still allow (the reader's "why can it not tell?")
    same = [c for c in comparisons if c.reading == "indistinguishable"]
    if same:
        parts.append("not distinguishable from " + " or from ".join(f"{c.b} ({points_text(c)})" for c in same)
                     + " at this n")
    head = f"{label[0].upper()}{label[1:]} planned {rate_text(k, n)} against {against}"
    return f"{head}: {', '.join(parts)}."


def smallest_resolvable_difference(n: int, base: float = 0.25) -> float:
    """The smallest gap in success rate, above a rate of ``base``, that :func:`compare_success`
    reads as a difference with ``n`` episodes per model (for the report's reading guide).

    By the unpaired interval: the conservative bound. On the same tasks the paired interval
    resolves smaller gaps by as much as the models' outcomes are correlated, which is unknown
    before the run."""
    k_b = int(round(base * n))
    for d in range(1, n - k_b + 1):
        if compare_success("a", k_b + d, n, "b", k_b, n).reading == "better":
            return d / n
    return 1.0


def _deg(x: float) -> str:
    return f"{x:.1f}°"


def drift_sentence(rounds: Sequence[Mapping]) -> str:
    """Frame drift in words, led by the variance-weighted measures (docs/gauge.md, §3).

    The angle within the global model's 95 %-energy subspace (``gauge/drift_subspace_angle_deg``)
    per round, then the last round's share of the participants' disagreement that a rotation
    explains (``gauge/drift_rotation_share``). The full-space geodesic angle
    (``gauge/drift_angle_deg``) is named only as a pointer to the report's tables: it sums the
    rotation over every latent direction, the near-empty ones Procrustes turns freely included,
    so it passes 180° and grows with noise (the report says how to read it). A run that recorded
    no variance-weighted measure (an older one) gets the full-space angle, labelled as such.
    """
    def points(key: str) -> list[tuple[int, float]]:
        return [(int(r.get("round", i)) + 1, float(r[key]))
                for i, r in enumerate(rounds) if isinstance(r.get(key), (int, float))]

    def series(pts: list[tuple[int, float]]) -> str:
        if len(pts) <= 5:
            return ", ".join(f"{_deg(a)} after round {t}" for t, a in pts)
        t_max, a_max = max(pts, key=lambda p: p[1])
        return (f"{_deg(pts[0][1])} after round {pts[0][0]}, {_deg(pts[-1][1])} after round {pts[-1][0]} "
                f"(largest {_deg(a_max)}, round {t_max})")

    within, full = points("gauge/drift_subspace_angle_deg"), points("gauge/drift_angle_deg")
    share = points("gauge/drift_rotation_share")
    if not within and not full:
        return ("Frame drift was not identifiable in any round (degenerate probe embeddings, "
                "gauge/drift_degenerate = 1): the latent frames cannot be compared.")
    if not within:
        text = ("Frame drift of the participants from the global model (full-space geodesic angle on the public "
                f"probe; this run recorded no variance-weighted measure): {series(full)}")
        missing = len(rounds) - len(full)
        if missing:
            text += f"; {missing} round(s) had frames too degenerate to measure"
        return text + "."
    text = ("Frame drift of the participants from the global model, within the global model's 95 %-energy "
            f"subspace of the public probe: {series(within)}")
    missing = len(rounds) - len(within)
    if missing:
        text += f"; {missing} round(s) could not be measured"
    if share:
        t, value = share[-1]
        text += (f". After round {t} a rotation explained {100 * value:.0f} % of the participants' disagreement "
                 "with the global model")
    unidentified = sum(1 for r in rounds if r.get("gauge/drift_degenerate") == 1 and
                       not isinstance(r.get("gauge/drift_angle_deg"), (int, float)))
    if unidentified:
        text += (f". In {unidentified} round(s) the full rotation was not identifiable (gauge/drift_degenerate = 1); "
                 "the subspace angle still compares the frames")
    if full:
        text += (". The full-space geodesic angle, which also counts the directions the embeddings barely use, "
                 "is in the report's drift tables")
    return text + "."


def _ratio(x: float) -> str:
    """A ratio with two decimals; an infinite bootstrap bound (a replicate gap of 0) as ∞."""
    return ("∞" if x > 0 else "−∞") if math.isinf(x) else f"{x:.2f}"


def _points_ci(x: float, ci: Sequence[float]) -> str:
    return f"{100 * x:+.0f} points [{100 * ci[0]:+.0f}, {100 * ci[1]:+.0f}]"


def gap_sentence(gap: GapRecovery | None, local_rates: Sequence[float], twin: tuple[int, int], *,
                 why: str | None = None) -> str:
    """Gap recovery in words: the baselines' success and ρ = (S_fed − S_local)/(S_twin − S_local).

    ``local_rates``: each local model's success rate on the shared tasks (S_local is their mean);
    ``twin``: the twin's (successes, tasks); ``gap``: from
    :func:`lensemble.report.baselines.gap_over_tasks` (one seed: a paired bootstrap over tasks), or
    None with ``why``. ρ is named with its interval only when the interval of S_twin − S_local
    excludes 0; otherwise the sentence says the gap is not distinguishable from 0 and ρ undefined.
    """
    k, n = twin
    head = (f"Against baselines trained from the same warm start at the same budget and scored on the same {n} "
            f"tasks, the {len(local_rates)} local models (each silo alone) planned "
            f"{pct(sum(local_rates) / len(local_rates))} % on average and the data-parallel twin (the silos' data "
            f"pooled) {rate_text(k, n)}")
    if gap is None:
        return f"{head}; gap recovery ρ was not computed: {why or 'no per-task outcomes'}."
    den = _points_ci(gap.denominator, gap.denominator_ci)
    if not gap.defined:
        return (f"{head}: the twin − local gap ({den}) is not distinguishable from 0 on these tasks, so gap "
                "recovery ρ is undefined; this run cannot say how much of the gap federation recovers.")
    lo, hi = gap.rho_ci
    text = (f"{head}: federation recovered ρ = {_ratio(gap.rho)} [{_ratio(lo)}, {_ratio(hi)}] of the twin − local "
            f"gap ({den}; 95 % paired bootstrap over the tasks, one seed)")
    if gap.denominator < 0:
        text += ", but the local models planned better than the twin, so ρ does not read as recovery"
    return text + "."


def communication_sentence(rounds: Sequence[Mapping], inner_steps: int) -> str:
    """Bytes per round against per-step synchronisation (H × the bytes of one round)."""
    sent = [int(r["fed/comm_bytes"]) for r in rounds if isinstance(r.get("fed/comm_bytes"), (int, float))]
    if not sent:
        return "Communication: no round recorded fed/comm_bytes."
    per_round = sum(sent) / len(sent)
    h = int(inner_steps)
    text = (f"Communication: {format_bytes(per_round)} per round on the wire ({len(sent)} rounds, "
            f"{format_bytes(sum(sent))} in all); synchronising after each of the H = {h} inner steps would "
            f"have sent {h}× as much ({format_bytes(h * per_round)} per round).")
    counts = [int(r["fed/secagg_participants"]) for r in rounds
              if isinstance(r.get("fed/secagg_participants"), (int, float))]
    if counts:  # [secagg] what the coordinator held, and the error the masking's quantisation adds
        bound = next((float(r["fed/secagg_mean_error_bound"]) for r in rounds
                      if isinstance(r.get("fed/secagg_mean_error_bound"), (int, float))), None)
        held = str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        text += f" Secure aggregation (Flower SecAgg+): the coordinator held only the sum of {held} updates per round"
        text += (f"; its quantisation adds < {bound:.2g} per coordinate of the mean." if bound is not None
                 else ".")
    return text


__all__ = ["SuccessComparison", "communication_sentence", "compare_success", "drift_sentence", "format_bytes",
           "gap_sentence", "paired_outcomes", "rate_text", "reading_of", "smallest_resolvable_difference",
           "success_sentence"]
