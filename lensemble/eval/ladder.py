"""The world-model evaluation ladder (DESIGN.md §7): separate numbers, never one blended score.

Each rung asks a different question of a frozen world model, on episodes it never trained on:

1. **One-step prediction** — teacher-forced ``g(z_{≤t}, a_t)`` against the encoded next frame,
   next to the *copy-last-latent* baseline ``z_{t+1} ≈ z_t``. A predictor that does not beat
   copying has learnt nothing about the actions. Beside it, the same two errors on (up to
   ``fit_episodes`` of) the silos' *training* episodes: a predictor that beats copying there but
   not on held-out episodes has fitted its training episodes without learning the dynamics
   (overfitting: PushT on 80 episodes, docs/model.md), where one that beats it on neither has not
   learnt them at all. The two readings call for different levers (more data against more steps).
2. **Open-loop rollout** — from a true latent history, feed the recorded actions for h latent steps
   without looking at frames again and compare ẑ_{t+h} with z_{t+h}, at h = 1, 10, 20. Horizons
   longer than an episode allows are clamped to the longest available one (``rollout_horizons``
   records requested → used). The composite is 0.1·e₁ + 0.2·e₁₀ + 0.7·e₂₀ on those clamped
   horizons, so long-range drift dominates it.
3. **Intervention response** — reset the env to a state, run two different action sequences from
   it, encode both outcomes. The true response difference is Δ = z_A − z_B, the predicted one
   Δ̂ = ẑ_A − ẑ_B (both rolled out from the same start latent). The error is the normalised squared
   error Σ‖Δ̂ − Δ‖² / Σ‖Δ‖² over all pairs: 0 means the model predicts how the outcome depends on
   the action exactly, 1 is what an action-blind model (Δ̂ = 0) scores, and it is undefined (None)
   when the encoder cannot tell the outcomes apart (Σ‖Δ‖² = 0). Differencing cancels whatever the
   two rollouts share (e.g. a constant bias), so this isolates the *action* dependence that
   planning relies on. Each sequence holds one uniform action per latent step for the b env
   steps of its block (held actions move the agent far enough for the outcomes to differ visibly).
4. **Linear probe** of ground-truth state from frozen latents: ridge regression fitted on
   train-split latents, scored on the evaluation split, features standardised with *train*
   statistics only; R² per state dimension (1 − SSE / SST around the evaluation split's mean),
   averaged over the env's probed dimensions (:data:`PROBE_DIMS`). R² ≈ 1: the state is linearly
   decodable; ≈ 0 (or below): it is not. Beside it, the **pixel baseline**: the same ridge probe on
   the top-k principal components of the raw pixels (k = 64, PCA fitted on the same train frames,
   pixels in [0, 1]). An encoder whose latents decode the state *worse* than a linear compression
   of its own input has thrown position away (issue 14 measured 0.30 against 0.77 for an early
   default), so the two are read together.
5. **Collapse guards** — effective dimension (participation ratio) and mean per-dimension std of
   the evaluation split's latents (read them together: one is scale-free, the other is not).

Units: errors 1–2 are mean squared errors per latent dimension (latent units²), the same scale as
the training loss; rung 3 and R² are dimensionless. Latent sequences are built at stride
``action_block``: frame ``t·b`` and the concatenation of the b env actions after it, the layout
the predictor trains on (docs/CONTRACTS.md).

Splits (DESIGN.md §6): ``"heldout"`` = the collection's episode split (every silo's held-out
episodes); ``"factor"`` = its transfer split (factor values no silo saw). The probe is always
fitted on the silos' train split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from lensemble.config.seeds import derive, numpy_rng
from lensemble.envs.adapter import env_info
from lensemble.envs.factors import PUSHT, REACHER, TWOROOM
from lensemble.errors import EvaluationError
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.model.encoder import embed_frames

#: Requested open-loop horizons (latent steps) and their weights in the composite.
HORIZONS: tuple[int, ...] = (1, 10, 20)
COMPOSITE_WEIGHTS: dict[int, float] = {1: 0.1, 10: 0.2, 20: 0.7}

#: State dimensions the linear probe decodes: what the frames show and planning needs.
#: TwoRoom: agent x, y (the target and doors are not moving parts of the observation).
#: PushT: agent x, y and block x, y (the angle wraps at 2π, which a linear probe cannot fit).
#: Reacher: the fingertip x, y (the shoulder angle wraps at ±π).
PROBE_DIMS: dict[str, tuple[int, ...]] = {TWOROOM: (0, 1), PUSHT: (0, 1, 2, 3), REACHER: (4, 5)}


@dataclass(frozen=True)
class LadderSettings:
    """Knobs of the ladder protocols (defaults are the documented protocol)."""

    horizons: tuple[int, ...] = HORIZONS
    weights: Mapping[int, float] = field(default_factory=lambda: dict(COMPOSITE_WEIGHTS))
    intervention_pairs: int = 32       # start states, each with two action sequences
    intervention_steps: int = 2        # latent steps per sequence (× action_block env steps)
    probe_ridge: float = 1e-3          # ridge penalty per sample on standardised latents
    pixel_pca_components: int = 64     # k of the pixel-PCA baseline (0 skips it); 64 as in issue 14
    max_probe_frames: int = 4096       # train frames used to fit the probe (evenly subsampled)
    fit_episodes: int = 40             # train episodes of the training-split one-step rung (0 skips it);
                                       # 40 matches a default silo's count, so the rung costs one silo's encode
    batch_size: int = 256              # frames per encoder call


@dataclass(frozen=True)
class LadderResult:
    """The ladder's numbers for one split (see the module docstring for definitions and units)."""

    split: str
    n_episodes: int
    one_step_error: float
    copy_last_error: float
    train_one_step_error: float | None       # the same two on training episodes (None: skipped)
    train_copy_last_error: float | None
    rollout_error: dict[int, float]          # used horizon -> MSE per latent dim
    rollout_horizons: dict[int, int]         # requested horizon -> used (clamped) horizon
    rollout_composite: float
    intervention_error: float | None
    intervention_pairs: int
    probe_r2: float | None
    probe_r2_per_dim: dict[str, float]
    pixel_pca_r2: float | None               # the same probe on a k-component PCA of the pixels
    effective_dim: float
    latent_std: float


# ============================================================================ pure metrics
def latent_mse(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Mean over every element of (pred − target)², in float64; shapes must match."""
    if pred.shape != target.shape:
        raise EvaluationError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ")
    return float(((pred.double() - target.double()) ** 2).mean())


def copy_last_error(z: torch.Tensor) -> float:
    """Copy-last-latent baseline: MSE of predicting z_{t+1} by z_t over z (E, L+1, d)."""
    if z.ndim != 3 or z.shape[1] < 2:
        raise EvaluationError(f"need latent sequences (E, L+1>=2, d), got {tuple(z.shape)}")
    return latent_mse(z[:, :-1], z[:, 1:])


@torch.no_grad()
def one_step_error(predictor, z: torch.Tensor, actions: torch.Tensor) -> float:
    """Teacher-forced one-step MSE.

    Args:
        predictor: callable ``predictor(z (E, L, d), a (E, L, A·b)) -> (E, L, d)`` whose output t
            predicts z_{t+1} from the true latents up to t (the :class:`Predictor` contract).
        z: (E, L+1, d) encoded frames at stride b.
        actions: (E, L, A·b) action blocks; actions[:, t] acts between z_t and z_{t+1}.
    """
    _check_sequences(z, actions)
    return latent_mse(predictor(z[:, :-1], actions), z[:, 1:])


@torch.no_grad()
def rollout_errors(
    predictor, z: torch.Tensor, actions: torch.Tensor, horizons: Sequence[int] = HORIZONS
) -> tuple[dict[int, float], dict[int, int]]:
    """Open-loop rollout MSE at each horizon, from every start that leaves room for it.

    From each start t0 the predictor sees the true history z_{t0−C+1..t0} (C = its context) (with the actions
    between those latents) and rolls out with the recorded actions. The error at horizon h is the
    MSE of ẑ_{t0+h} against z_{t0+h}, averaged over all episodes and all starts t0 ≤ L − h.
    A requested horizon above L (the episode's latent steps) is clamped to L.

    Args:
        predictor: has ``.context`` (latents an output can depend on; else ``.history``, W) and
            ``.rollout(z_hist, actions, past_actions=...)``.
        z: (E, L+1, d); actions: (E, L, A·b).
        horizons: requested horizons, each >= 1.

    Returns:
        (errors keyed by the used horizon, mapping requested -> used horizon).
    """
    _check_sequences(z, actions)
    if not horizons or min(horizons) < 1:
        raise EvaluationError(f"horizons must be >= 1, got {list(horizons)}")
    n_steps = actions.shape[1]
    used = {int(h): min(int(h), n_steps) for h in horizons}
    h_max = max(used.values())
    w = int(getattr(predictor, "context", getattr(predictor, "history", 1)))
    sums = torch.zeros(h_max + 1, dtype=torch.float64)
    counts = torch.zeros(h_max + 1, dtype=torch.float64)
    for t0 in range(n_steps):
        steps = min(h_max, n_steps - t0)
        lo = max(0, t0 - w + 1)
        past = actions[:, lo:t0] if t0 > lo else None
        pred = predictor.rollout(z[:, lo : t0 + 1], actions[:, t0 : t0 + steps], past_actions=past)
        err = ((pred.double() - z[:, t0 + 1 : t0 + 1 + steps].double()) ** 2).mean(dim=(0, 2))
        sums[1 : steps + 1] += err
        counts[1 : steps + 1] += 1
    errors = {h: float(sums[h] / counts[h]) for h in sorted(set(used.values()))}
    return errors, used


def rollout_composite(
    errors: Mapping[int, float], used: Mapping[int, int], weights: Mapping[int, float] = COMPOSITE_WEIGHTS
) -> float:
    """Σ_h w_h · e(used(h)) over the requested horizons h in ``weights``."""
    missing = [h for h in weights if h not in used]
    if missing:
        raise EvaluationError(f"no rollout error for horizons {missing}")
    return float(sum(w * errors[used[h]] for h, w in weights.items()))


def intervention_error(
    pred_a: torch.Tensor, pred_b: torch.Tensor, true_a: torch.Tensor, true_b: torch.Tensor
) -> float | None:
    """Normalised error of the predicted response difference, Σ‖Δ̂ − Δ‖² / Σ‖Δ‖².

    Args: each (N, d): predicted and encoded outcomes of sequences A and B from N start states.
    Returns: a float >= 0 (0 = exact, 1 = action-blind), or None when Σ‖Δ‖² = 0.
    """
    for t in (pred_b, true_a, true_b):
        if t.shape != pred_a.shape:
            raise EvaluationError("intervention outcomes must all have the same (N, d) shape")
    delta_hat = pred_a.double() - pred_b.double()
    delta = true_a.double() - true_b.double()
    denom = float((delta**2).sum())
    if denom <= 0.0:
        return None
    return float(((delta_hat - delta) ** 2).sum()) / denom


def linear_probe_r2(
    z_train: torch.Tensor,
    s_train: torch.Tensor,
    z_test: torch.Tensor,
    s_test: torch.Tensor,
    *,
    ridge: float = 1e-3,
) -> tuple[float | None, list[float | None]]:
    """Held-out R² of a ridge regression from latents to state.

    Args:
        z_train: (n, d) latents to fit on; s_train: (n, k) their ground-truth state.
        z_test: (m, d) latents to score; s_test: (m, k).
        ridge: penalty λ per training sample: the solve is (XᵀX + λ·n·I) W = Xᵀ Y on latents
            standardised with the train mean/std (a scale-free, small shrinkage).

    Returns:
        (mean R² over the dimensions that vary in the test set, per-dimension R² with None for a
        constant test dimension). None overall when no dimension varies.
    """
    if z_train.ndim != 2 or z_test.ndim != 2 or s_train.ndim != 2 or s_test.ndim != 2:
        raise EvaluationError("probe inputs must be 2-d: latents (n, d), states (n, k)")
    if z_train.shape[0] != s_train.shape[0] or z_test.shape[0] != s_test.shape[0]:
        raise EvaluationError("latents and states disagree on the number of samples")
    if z_train.shape[0] < 2:
        raise EvaluationError("the probe needs at least 2 training samples")
    x = z_train.double()
    mu, sd = x.mean(0), x.std(0, correction=0).clamp_min(1e-8)
    x = (x - mu) / sd
    y_mu = s_train.double().mean(0)
    y = s_train.double() - y_mu
    n, d = x.shape
    gram = x.T @ x + ridge * n * torch.eye(d, dtype=torch.float64)
    weight = torch.linalg.solve(gram, x.T @ y)  # (d, k)
    pred = ((z_test.double() - mu) / sd) @ weight + y_mu
    target = s_test.double()
    sse = ((target - pred) ** 2).sum(0)
    sst = ((target - target.mean(0)) ** 2).sum(0)
    per_dim: list[float | None] = []
    for e, t in zip(sse.tolist(), sst.tolist(), strict=True):
        per_dim.append(None if t <= 1e-12 * max(1, target.shape[0]) else 1.0 - e / t)
    valid = [r for r in per_dim if r is not None]
    return (float(np.mean(valid)) if valid else None), per_dim


def pixel_pca_probe_r2(
    obs_train: np.ndarray,
    s_train: torch.Tensor,
    obs_test: np.ndarray,
    s_test: torch.Tensor,
    *,
    components: int = 64,
    ridge: float = 1e-3,
) -> tuple[float | None, list[float | None]]:
    """The pixel baseline of the probe rung: :func:`linear_probe_r2` on a PCA of the raw pixels.

    Args:
        obs_train: uint8 (n, H, W, 3) frames to fit the PCA and the probe on; s_train: (n, k).
        obs_test: uint8 (m, H, W, 3) frames to score; s_test: (m, k).
        components: principal components kept (capped at n − 1 and at H·W·3).
        ridge: as in :func:`linear_probe_r2`.

    Pixels are scaled to [0, 1] and centred with the *train* mean; the basis is the top right
    singular vectors of the centred train matrix from a randomized SVD (``torch.svd_lowrank``:
    ``components`` + 16 directions, 4 power iterations, a fixed seed, so the result is
    deterministic). On 4096 frames of 64 px that takes ~1 s against ~73 s for the exact SVD on one
    thread, and its subspace agreed with the exact one to a smallest principal cosine of 0.999999
    (this matters: ``evaluate`` runs the ladder once per checkpoint).
    Returns what :func:`linear_probe_r2` returns.
    """
    if obs_train.ndim != 4 or obs_test.ndim != 4 or obs_train.shape[1:] != obs_test.shape[1:]:
        raise EvaluationError(f"pixel PCA needs frames (n, H, W, 3) of one size, got {obs_train.shape} "
                              f"and {obs_test.shape}")
    if components < 1:
        raise EvaluationError(f"pixel PCA needs components >= 1, got {components}")
    x_tr = torch.from_numpy(np.ascontiguousarray(obs_train.reshape(obs_train.shape[0], -1))).float() / 255.0
    x_te = torch.from_numpy(np.ascontiguousarray(obs_test.reshape(obs_test.shape[0], -1))).float() / 255.0
    mu = x_tr.mean(0, keepdim=True)
    k = min(components, x_tr.shape[0] - 1, x_tr.shape[1])
    if k < 1:
        raise EvaluationError("pixel PCA needs at least 2 training frames")
    with torch.random.fork_rng(devices=[]):  # svd_lowrank draws from the global RNG: seed a private copy
        torch.manual_seed(0)
        _, _, v = torch.svd_lowrank(x_tr - mu, q=min(k + 16, *x_tr.shape), niter=4)
    basis = v[:, :k]
    return linear_probe_r2((x_tr - mu) @ basis, s_train, (x_te - mu) @ basis, s_test, ridge=ridge)


def _even_indices(n: int, k: int) -> np.ndarray:
    """All of range(n) when n <= k, else k indices spread evenly over it (first and last kept)."""
    return np.arange(n) if n <= k else np.linspace(0, n - 1, k).round().astype(int)


def fit_episode_batch(train_batches: Sequence, max_episodes: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Up to ``max_episodes`` training episodes, taken evenly across the train batches' episodes
    (silo by silo, in order): uint8 obs (E, T+1, H, W, 3) and float32 actions (E, T, A), or None
    when there are none or ``max_episodes`` is 0. Only the chosen episodes are copied."""
    index = [(b, e) for b in train_batches for e in range(b.num_episodes)]
    if not index or max_episodes <= 0:
        return None
    chosen = [index[k] for k in _even_indices(len(index), max_episodes)]
    return np.stack([b.obs[e] for b, e in chosen]), np.stack([b.actions[e] for b, e in chosen])


def probe_train_frames(train_batches: Sequence, max_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """Every frame of the train batches, evenly subsampled to at most ``max_frames``: the frames
    both probes are fitted on. Returns uint8 (n, H, W, 3) frames and their (n, S) states."""
    obs = np.concatenate([b.obs.reshape(-1, *b.obs.shape[-3:]) for b in train_batches])
    state = np.concatenate([b.state.reshape(-1, b.state.shape[-1]) for b in train_batches])
    if obs.shape[0] > max_frames:  # index only when subsampling: obs[arange(n)] would copy every frame again
        keep = _even_indices(obs.shape[0], max_frames)
        obs, state = obs[keep], state[keep]
    return obs, state


def _check_sequences(z: torch.Tensor, actions: torch.Tensor) -> None:
    if z.ndim != 3 or actions.ndim != 3 or z.shape[0] != actions.shape[0] or z.shape[1] != actions.shape[1] + 1:
        raise EvaluationError(
            f"need z (E, L+1, d) and actions (E, L, A·b), got {tuple(z.shape)} and {tuple(actions.shape)}"
        )
    if actions.shape[1] < 1:
        raise EvaluationError("episodes are shorter than one latent step (action_block env steps)")


# ============================================================================ episode data
def encode_frames(encoder, frames: np.ndarray, batch_size: int = 256) -> torch.Tensor:
    """Encode uint8 frames (..., H, W, 3) to float32 latents (..., d) with :func:`embed_frames`."""
    lead = frames.shape[:-3]
    flat = torch.from_numpy(np.ascontiguousarray(frames.reshape(-1, *frames.shape[-3:]))).permute(0, 3, 1, 2)
    z = embed_frames(encoder, flat, batch_size)
    return z.reshape(*lead, z.shape[-1])


def latent_sequences(encoder, obs: np.ndarray, actions: np.ndarray, block: int, batch_size: int = 256):
    """Episodes at latent stride ``block``.

    Args:
        obs: uint8 (E, T+1, H, W, 3); actions: float32 (E, T, A).
    Returns:
        z (E, L+1, d) for frames 0, b, …, L·b and action blocks (E, L, A·b), with L = T // b.
    """
    e, t = actions.shape[:2]
    n_lat = t // block
    if n_lat < 1:
        raise EvaluationError(f"episodes of {t} steps are shorter than one action block ({block})")
    frames = obs[:, : n_lat * block + 1 : block]
    z = encode_frames(encoder, frames, batch_size)
    a = torch.from_numpy(np.ascontiguousarray(actions[:, : n_lat * block])).reshape(e, n_lat, block * actions.shape[2])
    return z, a.float()


# ============================================================================ interventions
@torch.no_grad()
def intervention_outcomes(model, env, factor_values: Sequence[dict], *, seed: int, pairs: int, steps: int):
    """Run the intervention protocol on a live env.

    For pair i: reset with seed ``derive(seed, "intervention", i)`` and factors
    ``factor_values[i % len]``, encode the start frame, run sequence A (``steps`` latent steps, one
    uniform action held per block), encode the outcome, put the env back in the start state, run
    sequence B, encode. Returns the four (N, d) tensors for :func:`intervention_error`.
    """
    block = model.cfg.action_block
    a_dim = env.info.action_dim
    low = np.asarray(env.info.action_low, np.float32)
    high = np.asarray(env.info.action_high, np.float32)
    starts, out_a, out_b, seq_a, seq_b = [], [], [], [], []
    for i in range(pairs):
        rng = numpy_rng(seed, "intervention", i)
        start = env.reset(derive(seed, "intervention", i), factor_values[i % len(factor_values)])
        s0 = env.state()
        frames = []
        seqs = []
        for _ in range(2):
            env.set_state(s0)
            held = rng.uniform(low, high, size=(steps, a_dim)).astype(np.float32)
            for a in held:
                for _ in range(block):
                    env.step(a)
            frames.append(env.render())
            seqs.append(np.repeat(held, block, axis=0).reshape(steps, block * a_dim))
        starts.append(start)
        out_a.append(frames[0])
        out_b.append(frames[1])
        seq_a.append(seqs[0])
        seq_b.append(seqs[1])
    z0 = encode_frames(model.encoder, np.stack(starts))
    true_a = encode_frames(model.encoder, np.stack(out_a))
    true_b = encode_frames(model.encoder, np.stack(out_b))
    with torch.inference_mode():
        pa = model.predictor.rollout(z0[:, None], torch.from_numpy(np.stack(seq_a)))[:, -1].clone()
        pb = model.predictor.rollout(z0[:, None], torch.from_numpy(np.stack(seq_b)))[:, -1].clone()
    return pa, pb, true_a, true_b


# ============================================================================ the whole ladder
def run_ladder(
    model,
    eval_batch,
    train_batches: Sequence,
    *,
    split: str,
    env=None,
    factor_values: Sequence[dict] | None = None,
    seed: int = 0,
    settings: LadderSettings = LadderSettings(),
    progress: Callable[[str], None] | None = None,
) -> LadderResult:
    """Every rung on one evaluation split.

    Args:
        model: a :class:`~lensemble.model.WorldModel` (put in eval mode; not modified).
        eval_batch: :class:`~lensemble.data.EpisodeBatch` of the evaluation split.
        train_batches: the silos' train-split batches (probe fitting only).
        split: "heldout" or "factor" (recorded in the result).
        env: an :class:`~lensemble.envs.EnvAdapter` for the intervention rung (None skips it).
        factor_values: factor dicts to reset the env with for interventions (the split's values).
        seed: root of the intervention seeds.
    """
    say = progress or (lambda _msg: None)
    model.eval()
    enc, pred, block = model.encoder, model.predictor, model.cfg.action_block
    env_id = eval_batch.meta.get("env_id", getattr(env, "env_id", TWOROOM))

    say("ladder: encoding held-out episodes")
    z, a = latent_sequences(enc, eval_batch.obs, eval_batch.actions, block, settings.batch_size)
    say("ladder: one-step and rollout errors")
    one = one_step_error(pred, z, a)
    copy = copy_last_error(z)
    train_one = train_copy = None
    fit = fit_episode_batch(train_batches, settings.fit_episodes)
    if fit is not None:
        say("ladder: one-step error on training episodes")
        z_fit, a_fit = latent_sequences(enc, fit[0], fit[1], block, settings.batch_size)
        train_one, train_copy = one_step_error(pred, z_fit, a_fit), copy_last_error(z_fit)
    errors, used = rollout_errors(pred, z, a, settings.horizons)
    composite = rollout_composite(errors, used, settings.weights)

    # Probe and collapse guards use every frame of the split, not only the stride-b ones.
    dims = PROBE_DIMS.get(env_id, tuple(range(eval_batch.state.shape[-1])))
    z_eval = encode_frames(enc, eval_batch.obs, settings.batch_size).reshape(-1, model.latent_dim)
    s_eval = torch.from_numpy(eval_batch.state.reshape(-1, eval_batch.state.shape[-1])[:, dims])
    say("ladder: linear probe (latents and the pixel-PCA baseline)")
    probe, per_dim, pixel_r2 = None, {}, None
    if train_batches:
        obs_tr, st_tr = probe_train_frames(train_batches, settings.max_probe_frames)
        z_tr = encode_frames(enc, obs_tr, settings.batch_size)
        probe, r2 = linear_probe_r2(z_tr, torch.from_numpy(st_tr[:, dims]), z_eval, s_eval,
                                    ridge=settings.probe_ridge)
        names = _state_names(env_id, eval_batch.state.shape[-1])
        per_dim = {names[d]: r for d, r in zip(dims, r2, strict=True) if r is not None}
        if settings.pixel_pca_components > 0:
            obs_ev = eval_batch.obs.reshape(-1, *eval_batch.obs.shape[-3:])
            pixel_r2, _ = pixel_pca_probe_r2(obs_tr, torch.from_numpy(st_tr[:, dims]), obs_ev, s_eval,
                                             components=settings.pixel_pca_components,
                                             ridge=settings.probe_ridge)

    inter, n_pairs = None, 0
    if env is not None and settings.intervention_pairs > 0:
        say("ladder: intervention response")
        values = list(factor_values) if factor_values else [{}]
        outs = intervention_outcomes(model, env, values, seed=seed, pairs=settings.intervention_pairs,
                                     steps=settings.intervention_steps)
        inter, n_pairs = intervention_error(*outs), settings.intervention_pairs

    return LadderResult(
        split=split,
        n_episodes=eval_batch.num_episodes,
        one_step_error=one,
        copy_last_error=copy,
        train_one_step_error=train_one,
        train_copy_last_error=train_copy,
        rollout_error=errors,
        rollout_horizons=used,
        rollout_composite=composite,
        intervention_error=inter,
        intervention_pairs=n_pairs,
        probe_r2=probe,
        probe_r2_per_dim=per_dim,
        pixel_pca_r2=pixel_r2,
        effective_dim=effective_dim(z_eval),
        latent_std=latent_std(z_eval),
    )


def _state_names(env_id: str, width: int) -> list[str]:
    try:
        names = list(env_info(env_id).state_names)
        if len(names) == width:
            return names
    except Exception:  # an unknown env only loses the names, never the numbers
        pass
    return [f"s{i}" for i in range(width)]


__all__ = [
    "LadderSettings",
    "copy_last_error",
    "fit_episode_batch",
    "intervention_error",
    "latent_sequences",
    "linear_probe_r2",
    "one_step_error",
    "pixel_pca_probe_r2",
    "probe_train_frames",
    "rollout_composite",
    "rollout_errors",
]
