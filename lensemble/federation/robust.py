"""The coordinator's defence against one participant's update: a norm bound and robust aggregates.

Threat: a participant (broken or hostile) that sends a finite, well-shaped pseudo-gradient Δ_c that
no honest silo would send — its real update × 1e4, say. The shape and finiteness checks of
:mod:`lensemble.federation.validation` pass it, and one such Δ in the mean wrecks the global
(issue 33: 1394 from the warm start after one round, against 0.29 for a clean round). Two lines of
defence, applied by the coordinator on every engine (they all close rounds through
:meth:`~lensemble.federation.coordinator.Coordinator.close_round`):

1. **A per-participant L2 bound** (:func:`norm_bound`). A reply with ‖Δ_c‖₂ above the round's bound
   is dropped with its reason, like any unusable reply; the quorum rule then decides. The bound is
   derived from the run itself, never a constant:

   - the **step bound** (:func:`step_bound`): the farthest an honest release can be from the global,
     from the config and the global alone — H AdamW steps at ``train.lr`` move a coordinate by at
     most H·lr·(A + wd·|θ_i|) (A ≈ 7.27: Adam's normalised step for torch's betas, below), the
     backstop's rotation adds at most 2‖rotated tensors‖, and under DP a release is the clipped Δ
     plus Gaussian noise, at most clip·(1 + σ(√n + 7)). It holds for any honest silo, in any round,
     whatever the others send, so it also covers round 0 and two-participant rounds. It is loose
     (14x the measured honest norm on ``experiment=micro``), so
   - a **relative bound**: ``federation.update_norm_factor`` (10) × a reference norm, the larger
     of the lower median of this round's norms and the lower median of the accepted norms of the
     last :data:`HISTORY_ROUNDS` rounds (the reasons are beside the code).

   The bound is min(step bound, max(factor × reference, floor)), where the **floor**
   (:func:`norm_floor`: ``federation.update_norm_floor`` × the step bound; the step bound itself
   under DP) comes from the config and the global alone, so no participant can lower it: with two
   participants a near-zero update would otherwise set the reference and get the honest one
   dropped (issue 47). An accepted hostile update can then move the mean Δ̄ by at most bound / C
   per round.

2. **A direction screen** (:func:`screen_directions`, ``federation.update_max_cancel``): an update
   inside the bound can still point against the others (issue 47: one of three silos sending −9x
   its update, norm under the bound, collapsed the global). No update may cancel more than
   ``update_max_cancel`` (0.5) of the others' step (their mean, or coordinate-wise median with 3 or
   more) along its direction. With C = 2 no geometry tells the two apart (the pair is
   scale-symmetric), so if one cancels the other both are dropped and the quorum decides: a hostile
   one of two can stop rounds, as by not replying, but not steer them. Off under DP (noise
   dominates every direction) and under secure aggregation.

3. **A robust aggregate** instead of the mean (``federation.aggregate``), see :func:`robust_mean`.

Under secure aggregation neither applies: the coordinator sees only the sum S = Σ Δ_c. What it can
check is ‖S‖₂ <= C·(B + q√n) (:func:`lensemble.federation.secure_agg.check_secure_sum`), which
bounds the mean, ‖Δ̄‖₂ <= B + q√n, not any one update: a participant may use the whole budget the
others leave. :func:`secure_update_settings` makes B (``federation.secagg_max_norm=None``) the
step bound instead of c·√n, so a participant that skips its own pre-mask check and lets Flower clip
its ×1e4 update to ±c is refused (its sum is ~c√n), and an accepted sum moves the global by at most
as much as one bound-sized honest round would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

from lensemble.config.schema import LensembleConfig
from lensemble.errors import FaultToleranceExceeded
from lensemble.federation.checks import DP_TAIL_SIGMAS
from lensemble.federation.outer import aggregate_checked, state_digest
from lensemble.federation.pseudograd import StateDict
from lensemble.federation.secure_agg import SecAggSettings
from lensemble.gauge.backstop import FRAME_WEIGHT, IN_PROJ_WEIGHT, OUT_PROJ_BIAS, OUT_PROJ_WEIGHT

#: torch.optim.AdamW's betas (the inner loop passes none).
ADAM_BETAS = (0.9, 0.999)


def adam_step_ceiling(beta1: float = ADAM_BETAS[0], beta2: float = ADAM_BETAS[1]) -> float:
    """A: the largest |m̂_t / √v̂_t| Adam can take, for any gradients and any step t (≈ 7.27).

    m_t = (1-β1) Σ_k β1^k g_{t-k} and v_t = (1-β2) Σ_k β2^k g²_{t-k}; Cauchy-Schwarz on
    β1^k = (β1/√β2)^k · √β2^k gives |m_t| <= (1-β1)/√(1-β2) · (1 - β1²/β2)^(-1/2) · √v_t, and the bias
    corrections √(1-β2^t)/(1-β1^t) <= 1 for torch's betas. ε only shrinks the step.
    """
    return (1.0 - beta1) / math.sqrt(1.0 - beta2) / math.sqrt(1.0 - beta1 * beta1 / beta2)


#: Names the backstop (rung 3) rotates in the full local weights before re-differencing.
ROTATED = (FRAME_WEIGHT, IN_PROJ_WEIGHT, OUT_PROJ_WEIGHT, OUT_PROJ_BIAS)
#: Rounds of accepted norms the reference remembers (the coordinator's history, so a resumed run
#: computes the same bound). 3: with C = 2 and one hostile silo the pool then holds at least 3
#: honest norms against at most 4 of the other, so its lower median stays an honest value; short
#: enough that the reference follows honest updates as training shrinks them (2x between micro's
#: two rounds at rung 3).
HISTORY_ROUNDS = 3
#: How the screens' drop reasons start (validation.py's quorum remedy recognises them by these).
NORM_REASON = "sent an update of norm"
DIRECTION_REASON = "sent an update pointing against"


def _l2(arrays: Mapping[str, object], names=None) -> float:
    """‖·‖₂ of the named (default: all) floating arrays, in float64, in sorted name order."""
    total = 0.0
    for name in sorted(arrays if names is None else (n for n in names if n in arrays)):
        a = arrays[name]
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        if a.dtype.kind == "f":
            total += float(np.sum(np.square(a, dtype=np.float64)))
    return math.sqrt(total)


def step_bound(cfg: LensembleConfig, global_params: Mapping[str, object]) -> float:
    """The L2 ceiling on an honest participant's released Δ this round (the run's "step bound").

    ``global_params``: the round's global federated tensors (name -> tensor or array; n
    coordinates in all), as the coordinator holds them and as every participant receives them,
    so both sides compute the same bound.

    - privacy on: the release is clip(Δ) + N(0, (σ·clip)² I_n), so ‖Δ‖ <= clip·(1 + σ(√n + 7)):
      ‖N(0, I_n)‖ exceeds √n + 7 with probability below e^(-49/2) ≈ 2e-11 (Gaussian concentration
      of a 1-Lipschitz function), the 7σ of the SecAgg+ range check (checks.DP_TAIL_SIGMAS).
    - else: each of H AdamW steps moves coordinate i by at most lr·(A + wd·|θ_i|) (A:
      :func:`adam_step_ceiling`; the warm-up only lowers lr), so ‖Δ‖ <= H·lr·(A√n + wd‖θ‖) by the
      triangle inequality; with the backstop, rotating the local weights by an orthogonal Q changes
      the rotated tensors W by ‖(Q - I)W‖ <= 2‖W‖ <= 2(‖W_global‖ + that step part).
    - int8 quantisation adds at most max|Δ|/254 per coordinate: × (1 + √n/254).
    """
    n = sum(int(np.asarray(v.shape).prod()) for v in global_params.values())
    root_n = math.sqrt(n)
    if cfg.privacy.enabled:
        clip = float(cfg.privacy.clip_norm)
        bound = clip * (1.0 + float(cfg.privacy.noise_multiplier) * (root_n + DP_TAIL_SIGMAS))
    else:
        steps = cfg.federation.inner_steps * float(cfg.train.lr)
        bound = steps * (adam_step_ceiling() * root_n + float(cfg.train.weight_decay) * _l2(global_params))
        if cfg.gauge.backstop:
            bound += 2.0 * (_l2(global_params, ROTATED) + bound)
    if cfg.federation.quantize_int8:
        bound *= 1.0 + root_n / 254.0
    return bound


def lower_median(values) -> float | None:
    """The lower median (the ⌈k/2⌉-th smallest of k values), None for none. Lower, not the
    midpoint: with two values it is the smaller, so one inflated value of two never sets it."""
    ordered = sorted(float(v) for v in values)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


@dataclass(frozen=True)
class NormBound:
    """Round t's bound on ‖Δ_c‖₂ and where it came from (all L2 norms of the federated vector)."""

    bound: float  # min(step, max(factor × reference, floor)), or ``step`` alone when there is no reference
    step: float  # the step bound (or federation.update_max_norm)
    reference: float | None  # max(round, history): the honest scale the factor multiplies
    round_reference: float | None  # lower median of this round's norms
    history_reference: float | None  # lower median of the accepted norms of the last rounds
    factor: float | None
    floor: float | None = None  # the least the relative bound may be (norm_floor): no participant sets it

    def describe(self) -> str:
        if self.reference is None or self.bound >= self.step:
            return f"the run's step bound {self.step:.4g}"
        if self.floor is not None and self.bound <= self.floor:
            return f"the floor {self.floor:.4g}, federation.update_norm_floor x the step bound {self.step:.4g}"
        return f"{self.factor:g} x the reference norm {self.reference:.4g}"


def norm_floor(cfg: LensembleConfig, step: float) -> float | None:
    """The least a round's norm bound may be, from the config and the step bound alone (issue 47).

    Without it, with two participants, a near-zero update is the lower median: it sets the reference
    and the honest update is dropped (round 0), and once such updates are accepted they fill half
    the history too. ``federation.update_norm_floor`` x ``step``: 0.5 by default, 2x the largest
    honest fraction measured (0.23 of the step bound at the backstop rung on ``experiment=micro``;
    0.07 at the naive rung). Under DP the honest release is the noise, within 7/√n of the step bound,
    so the floor is the step bound: a relative bound could only drop honest releases there.
    None: no floor (the relative bound alone, as before issue 47).
    """
    if cfg.privacy.enabled:
        return step
    fraction = cfg.federation.update_norm_floor
    return None if fraction is None else float(fraction) * step


def norm_bound(norms: Mapping[str, float], history_norms, *, step: float, factor: float | None,
               floor: float | None = None) -> NormBound:
    """The bound a round's updates are held to, from their own norms and the recent accepted ones.

    ``norms``: participant id -> ‖Δ_c‖₂ of this round's well-formed updates; ``history_norms``:
    the accepted norms of the last :data:`HISTORY_ROUNDS` rounds; ``step``: :func:`step_bound`.

    reference = max(lower median of this round, lower median of the history):
    - this round's lower median is an honest norm whenever fewer than half the participants inflate
      theirs (with C = 2: the smaller of the two, so one ×1e4 update is refused in round 0 already);
    - the history's lower median keeps a participant that sends a tiny update from dragging the
      reference down (with C = 2 it would otherwise set it, and the honest update would be dropped);
    - the max lets honest updates that all grow at once (a new training phase) through: they set
      this round's median, while a single inflated one cannot.
    A participant that shrinks its update is never dropped: that can only slow the mean. Nor can it
    lower the bound below ``floor`` (:func:`norm_floor`), which no participant's norm enters.
    """
    round_ref = lower_median(norms.values())
    hist_ref = lower_median(history_norms)
    refs = [r for r in (round_ref, hist_ref) if r is not None and r > 0]
    # No positive reference (every update zero, or none): nothing to scale, the step bound alone.
    reference = max(refs) if refs else None
    if reference is None or factor is None:
        bound = step
    else:
        bound = min(step, max(factor * reference, floor if floor is not None else 0.0))
    return NormBound(bound=bound, step=step, reference=reference, round_reference=round_ref,
                     history_reference=hist_ref, factor=factor, floor=floor)


def update_norms(deltas: Mapping[str, StateDict]) -> dict[str, float]:
    """participant id -> ‖Δ_c‖₂ over every federated tensor (float64, sorted names)."""
    return {pid: _l2(delta) for pid, delta in sorted(deltas.items())}


def screen_norms(deltas: Mapping[str, StateDict], history_norms, *, step: float,
                 factor: float | None, floor: float | None = None
                 ) -> tuple[dict[str, StateDict], dict[str, str], NormBound, dict[str, float]]:
    """(kept Δ, dropped id -> reason, the bound, every norm) of a round's well-formed updates."""
    norms = update_norms(deltas)
    nb = norm_bound(norms, history_norms, step=step, factor=factor, floor=floor)
    kept, dropped = {}, {}
    for pid, delta in sorted(deltas.items()):
        if norms[pid] > nb.bound:
            dropped[pid] = (f"{NORM_REASON} {norms[pid]:.4g} above the bound {nb.bound:.4g} "
                            f"({nb.describe()})")
        else:
            kept[pid] = delta
    return kept, dropped, nb, norms


def _others_reference(deltas: Mapping[str, StateDict], order: list[str], i: int) -> dict[str, np.ndarray]:
    """The others' step as update ``order[i]`` is judged against: their mean with 1 or 2 others, their
    coordinate-wise median with 3 or more (each coordinate then lies within the honest values' range
    while fewer than half of them are hostile), in float64."""
    others = [p for j, p in enumerate(order) if j != i]
    out = {}
    for name in sorted(deltas[order[0]]):
        arrays = [deltas[p][name] for p in others]
        arrays = [a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a) for a in arrays]
        if arrays[0].dtype.kind != "f":
            continue
        stack = np.stack([a.astype(np.float64).reshape(-1) for a in arrays])
        out[name] = np.median(stack, axis=0) if len(others) >= 3 else stack.mean(axis=0)
    return out


def _dot(delta: StateDict, ref: Mapping[str, np.ndarray]) -> float:
    total = 0.0
    for name in sorted(ref):
        a = delta[name]
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        total += float(np.dot(a.astype(np.float64).reshape(-1), ref[name]))
    return total


def screen_directions(deltas: Mapping[str, StateDict], *, max_cancel: float
                      ) -> tuple[dict[str, StateDict], dict[str, str], dict[str, float]]:
    """(kept Δ, dropped id -> reason, id -> cancelled fraction) of the updates that passed the norm bound.

    For update c, m = the others' step (:func:`_others_reference`: their mean, or their median with
    3 or more) and p_c = Δ_c · m/‖m‖, its component along it. Adding c moves the mean along m by
    ((C−1)‖m‖ + p_c)/C, so c cancels the fraction −p_c / ((C−1)‖m‖) of the others' progress; above
    ``max_cancel`` (0.5) it is dropped. A sign-flipped −9x update cancelled 0.98–2.97 of it on
    ``experiment=micro`` (4 rounds); an honest one at most 0.05, although honest updates of one round are
    only weakly aligned (pairwise cosines −0.05 to 0.66 measured; so no plain cosine threshold
    separates them: a −9x update keeps a positive cosine with the coordinate-wise median of all, and
    two honest updates may have a negative one). An accepted update then leaves the others at least
    1 − max_cancel of their step along their own direction.

    C = 2: which of the two is hostile no geometry says (a −9x update against an honest one is an
    honest update against a tiny flipped one, scaled), so when either cancels more than
    ``max_cancel`` of the other both are dropped and the quorum decides.

    A zero update, or one whose others' step is zero, is never dropped here.
    """
    order = sorted(deltas)
    c = len(order)
    if c < 2:
        return dict(deltas), {}, {}
    cancel: dict[str, float] = {}
    for i, p in enumerate(order):
        ref = _others_reference(deltas, order, i)
        m = math.sqrt(sum(float(np.dot(v, v)) for v in ref.values()))
        cancel[p] = 0.0 if m == 0 else max(0.0, -_dot(deltas[p], ref) / m / ((c - 1) * m))
    if c == 2:
        worst = max(cancel.values())
        if worst > max_cancel:
            dropped = {p: (f"{DIRECTION_REASON} the other's: one of the two cancels {worst:.2f} of the other's step "
                           f"along its direction (more than federation.update_max_cancel = {max_cancel:g}); with two "
                           "updates the coordinator cannot tell which is hostile and keeps neither") for p in order}
            return {}, dropped, cancel
        return dict(deltas), {}, cancel
    kept, dropped = {}, {}
    for p in order:
        if cancel[p] > max_cancel:
            dropped[p] = (f"{DIRECTION_REASON} the others: it cancels {cancel[p]:.2f} of their step along its "
                          f"direction (more than federation.update_max_cancel = {max_cancel:g})")
        else:
            kept[p] = deltas[p]
    return kept, dropped, cancel


def direction_screen_on(cfg: LensembleConfig) -> bool:
    """Whether the coordinator screens directions: ``federation.update_max_cancel`` set, no DP (the
    Gaussian noise, ~σ·clip·√n against a signal <= clip, makes every direction noise)."""
    return cfg.federation.update_max_cancel is not None and not cfg.privacy.enabled


def screen_updates(cfg: LensembleConfig, deltas: Mapping[str, StateDict], history: list[dict],
                   global_params: Mapping[str, object]) -> tuple[dict[str, StateDict], dict[str, str], dict, dict]:
    """The coordinator's screens of a plaintext round, the norm bound then the direction: (kept Δ,
    dropped id -> reason, round metrics, kept id -> norm for the history). ``history``: the
    coordinator's per-round records (their ``update_norms``); ``global_params``: the global the
    round was asked with."""
    f = cfg.federation
    step = float(f.update_max_norm) if f.update_max_norm is not None else step_bound(cfg, global_params)
    kept, dropped, nb, norms = screen_norms(deltas, recent_norms(history), step=step, factor=f.update_norm_factor,
                                            floor=norm_floor(cfg, step))
    metrics = {"fed/norm_bound": nb.bound, "fed/step_bound": nb.step, "fed/norm_reference": nb.reference,
               "fed/norm_floor": nb.floor, "fed/norm_dropped": len(dropped)}
    if direction_screen_on(cfg):
        kept, turned, cancel = screen_directions(kept, max_cancel=float(f.update_max_cancel))
        dropped |= turned
        metrics |= {"fed/direction_dropped": len(turned),
                    "fed/direction_cancel_max": max((cancel[p] for p in kept if p in cancel), default=None)}
    metrics["fed/update_norm_max"] = max((norms[p] for p in kept), default=None)
    return kept, dropped, metrics, {p: norms[p] for p in kept}


def recent_norms(history: list[dict], rounds: int = HISTORY_ROUNDS) -> list[float]:
    """The accepted update norms the coordinator recorded in its last ``rounds`` rounds."""
    out: list[float] = []
    for entry in history[-rounds:]:
        out.extend(float(v) for _, v in sorted((entry.get("update_norms") or {}).items()))
    return out


def required_participants(cfg: LensembleConfig) -> int:
    """The fewest accepted updates a round needs: the quorum, and for the trimmed mean 2·trim + 1
    (fewer would trim everything)."""
    f = cfg.federation
    need = f.min_participants
    if f.aggregate == "trimmed_mean":
        need = max(need, 2 * f.trim + 1)
    return need


def robust_mean(deltas: Mapping[str, StateDict], how: str, trim: int = 1) -> StateDict:
    """Δ̄ of the accepted updates: ``mean`` (:func:`~lensemble.federation.outer.aggregate_checked`),
    or per coordinate the ``median`` or the ``trimmed_mean`` (drop the ``trim`` largest and
    smallest values, average the rest).

    Per tensor the C updates are stacked in sorted participant order in float64 ((C, *shape),
    C x the tensor's memory), sorted along the participant axis (O(n·C log C)) and reduced; the
    result is rounded once to fp32. Both are order-independent and bitwise deterministic; like the
    mean, they run twice and are compared bitwise. Where they cannot apply: with C = 2 the median is
    the mean; the trimmed mean needs C >= 2·trim + 1 (:func:`required_participants`); under
    secure aggregation there are no individual updates to sort (checks refuse the combination).
    """
    if how == "mean":
        return aggregate_checked(deltas)
    if how not in ("median", "trimmed_mean"):
        raise ValueError(f"unknown aggregate {how!r}")

    def once() -> StateDict:
        order = sorted(deltas)
        out: StateDict = {}
        for name in sorted(deltas[order[0]]):
            stack = torch.stack([deltas[p][name].detach().to("cpu", torch.float64) for p in order])
            if how == "median":
                # torch.median returns the lower of two middle values: the midpoint is the median
                ordered = torch.sort(stack, dim=0).values
                c = ordered.shape[0]
                mid = ordered[(c - 1) // 2] if c % 2 else (ordered[c // 2 - 1] + ordered[c // 2]) / 2
            else:
                if stack.shape[0] < 2 * trim + 1:
                    raise FaultToleranceExceeded(
                        f"{stack.shape[0]} update(s) cannot be trimmed by {trim} on each side",
                        accepted=int(stack.shape[0]), min_participants=2 * trim + 1)
                ordered = torch.sort(stack, dim=0).values
                mid = ordered[trim:ordered.shape[0] - trim].sum(dim=0) / (ordered.shape[0] - 2 * trim)
            out[name] = mid.to(torch.float32)
        return out

    first, second = once(), once()
    if state_digest(first) != state_digest(second):
        from lensemble.errors import NonDeterministicAggregation
        raise NonDeterministicAggregation(f"two {how} aggregations of the same pseudo-gradients differ",
                                          first=state_digest(first), second=state_digest(second))
    return first


def secure_update_settings(cfg: LensembleConfig, global_params: Mapping[str, object]) -> SecAggSettings:
    """The SecAgg+ settings an update is checked with, before masking and as a sum.

    With ``federation.secagg_max_norm`` unset, B is the run's :func:`step_bound` (at most c·√n, the
    bound the coordinate range implies): participant and coordinator compute it from the same
    config and global. Set, it is used as given.
    """
    settings = SecAggSettings.from_config(cfg.federation)
    if settings.max_norm is not None:
        return settings
    n = sum(int(np.asarray(v.shape).prod()) for v in global_params.values())
    return replace(settings, max_norm=min(settings.clip_range * math.sqrt(n), step_bound(cfg, global_params)))


__all__ = ["ADAM_BETAS", "DIRECTION_REASON", "HISTORY_ROUNDS", "NORM_REASON", "ROTATED", "NormBound",
           "adam_step_ceiling", "direction_screen_on", "lower_median", "norm_bound", "norm_floor",
           "recent_norms", "screen_directions", "required_participants", "robust_mean", "screen_norms", "screen_updates", "secure_update_settings",
           "step_bound", "update_norms"]
