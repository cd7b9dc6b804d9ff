"""Frame anchor: the loss term that breaks the O(d) gauge symmetry (ladder rung 4).

Prediction and isotropic SIGReg are unchanged by z -> z Q, so nothing in the objective tells a
participant which basis to use. The anchor ties the basis to a frozen reference encoder f_ref (the
hash-pinned warm start; never a random init, which would pin noise) on k >= d public probe
landmarks p_i with targets t_i = f_ref(p_i):

* Variant A (landmark MSE): L = (1/k) Σ_i ||f_θ(p_i) - t_i||². With k >= d targets spanning R^d,
  the only rotation that keeps this small is the identity, so it pins the frame (and, as a side
  effect, pulls the content towards the reference too).
* Variant B (rotational): L = ||Q* - I||²_F with Q* = Procrustes(f_θ(P) -> T). It penalises only
  the rotation part of the mismatch and leaves content free.

Gradients of variant B go through the orthogonal polar factor Q* = U Vᵀ of M = Zᵀ T = U Σ Vᵀ.
Its exact derivative is dQ = U Y Vᵀ with Y_ij = (C_ij - C_ji) / (σ_i + σ_j), C = Uᵀ dM V: it
depends on SUMS of singular values, never on the gaps σ_i - σ_j that make generic SVD backward
passes blow up (and they do blow up here: SIGReg pushes latents towards an isotropic cloud, whose
cross-covariance has nearly equal singular values). The sums vanish only when M loses rank; we
condition them by clamping σ_i + σ_j from below at ``singular_floor · σ_max``, which leaves the
gradient exact whenever M is better conditioned than the floor and bounded when it is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from lensemble.config.seeds import torch_generator
from lensemble.errors import ConfigError, DegenerateProcrustes, GaugeError
from lensemble.gauge.procrustes import as_float64_matrix, check_singular_floor
from lensemble.model.precision import full_precision

__all__ = ["differentiable_polar", "select_landmarks", "FrameAnchor"]


class _ConditionedPolar(torch.autograd.Function):
    """Q = U Vᵀ of M (d, d) with the conditioned backward described in the module docstring."""

    @staticmethod
    def forward(ctx, m: torch.Tensor, singular_floor: float) -> torch.Tensor:
        m64 = m.detach().to(torch.float64)
        u, sigma, vh = torch.linalg.svd(m64)
        if not bool(torch.isfinite(sigma).all()) or float(sigma[0]) <= 0.0:
            raise DegenerateProcrustes(
                "anchor cross-covariance is zero or non-finite (collapsed or diverged latents)",
                sigma_min=float(sigma[-1]),
                singular_floor=singular_floor,
            )
        ctx.save_for_backward(u, sigma, vh)
        ctx.singular_floor = singular_floor
        ctx.in_dtype = m.dtype
        return (u @ vh).to(m.dtype)

    @staticmethod
    def backward(ctx, grad_q: torch.Tensor):
        u, sigma, vh = ctx.saved_tensors
        g_hat = u.mT @ grad_q.to(torch.float64) @ vh.mT  # Uᵀ G V
        denom = (sigma.unsqueeze(-1) + sigma.unsqueeze(-2)).clamp_min(ctx.singular_floor * sigma[0])
        grad_m = u @ ((g_hat - g_hat.mT) / denom) @ vh
        return grad_m.to(ctx.in_dtype), None


def differentiable_polar(m: torch.Tensor, *, singular_floor: float = 1e-6) -> torch.Tensor:
    """Differentiable orthogonal polar factor Q = U Vᵀ of a square M (d, d).

    Q is the Procrustes rotation for M = sourceᵀ target. Forward in float64, returned in M's
    dtype; backward is the exact polar derivative with σ_i + σ_j clamped at
    ``singular_floor · σ_max`` (finite on repeated or vanishing singular values).
    """
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise GaugeError(f"differentiable_polar expects a square (d, d) matrix, got {tuple(m.shape)}")
    return _ConditionedPolar.apply(m, float(singular_floor))


def select_landmarks(num_probe: int, k: int, *, seed: int = 0, probe_hash: str | None = None) -> torch.Tensor:
    """Deterministically choose k of the num_probe probe frames as anchor landmarks.

    A seeded uniform sample without replacement (stream ``derive(seed, "anchor", "landmarks",
    probe_hash)``), returned sorted: the same probe and seed give the same landmarks on every
    participant and machine.

    Returns:
        (k,) int64 indices into the probe, ascending.
    """
    if k < 1 or k > num_probe:
        raise ConfigError(
            f"gauge.anchor_landmarks={k} must be in [1, |P|={num_probe}]",
            remediation="Lower gauge.anchor_landmarks or raise data.probe_frames.",
        )
    if k == num_probe:
        return torch.arange(num_probe, dtype=torch.long)
    perm = torch.randperm(num_probe, generator=torch_generator(seed, "anchor", "landmarks", probe_hash or ""))
    return torch.sort(perm[:k]).values


class FrameAnchor:
    """The anchor loss on k landmark embeddings.

    Args:
        targets: (k, d) frozen reference embeddings t_i = f_ref(p_i); copied and detached.
        landmark_idx: (k,) indices of the landmarks in the probe, in the order of ``targets``
            (the caller feeds ``probe_frames[anchor.landmark_idx]`` through f_θ).
        variant: "A" (landmark MSE) or "B" (||Q* - I||²_F).
        singular_floor: relative floor, both for validating the targets and for conditioning
            variant B's backward pass.

    Raises:
        ConfigError: k < d (the frame is not pinned by fewer landmarks than dimensions), an
            unknown variant, or mismatched shapes.
        DegenerateProcrustes: the targets do not span R^d (relative floor).

    ``anchor(z_landmarks (k, d)) -> scalar`` loss in z's dtype, differentiable w.r.t. z.
    """

    def __init__(
        self,
        targets: torch.Tensor,
        landmark_idx: torch.Tensor | Sequence[int],
        variant: Literal["A", "B"] = "A",
        *,
        singular_floor: float = 1e-6,
    ):
        if variant not in ("A", "B"):
            raise ConfigError(f"gauge.anchor must be 'A' or 'B', got {variant!r}")
        t64 = as_float64_matrix(targets, "anchor targets")
        k, d = t64.shape
        if k < d:
            raise ConfigError(
                f"gauge.anchor_landmarks k={k} < latent_dim d={d}: fewer landmarks than dimensions "
                "leave a subspace of rotations unpinned",
                remediation="Use k >= model.latent_dim anchor landmarks (gauge.anchor_landmarks).",
            )
        idx = torch.as_tensor(landmark_idx, dtype=torch.long).reshape(-1)
        if idx.numel() != k:
            raise ConfigError(f"landmark_idx has {idx.numel()} entries but targets have k={k} rows")
        # Targets must span R^d, or no set of landmarks can pin every direction.
        check_singular_floor(torch.linalg.svdvals(t64).unsqueeze(0), singular_floor, ["anchor targets"])
        self.targets = targets.detach().clone()
        self.landmark_idx = idx.clone()
        self.variant = variant
        self.singular_floor = float(singular_floor)

    @property
    def k(self) -> int:
        return int(self.targets.shape[0])

    @property
    def d(self) -> int:
        return int(self.targets.shape[1])

    @classmethod
    @torch.no_grad()
    def from_reference(
        cls,
        reference_encoder: nn.Module,
        probe_frames: torch.Tensor,
        *,
        k: int,
        variant: Literal["A", "B"] = "A",
        seed: int = 0,
        probe_hash: str | None = None,
        singular_floor: float = 1e-6,
        batch_size: int = 256,
        landmark_idx: torch.Tensor | Sequence[int] | None = None,
    ) -> FrameAnchor:
        """Build the anchor from the frozen reference encoder f_ref and the public probe.

        Args:
            reference_encoder: f_ref, frames (B, ...) -> (B, d); run in eval mode, no grad.
            probe_frames: (|P|, ...) probe frames (uint8 or float, as the encoder takes them).
            k: number of landmarks (>= d).
            landmark_idx: the landmarks to use, e.g. the landmark part of the probe split
                (:func:`lensemble.data.probe.split_probe`), which keeps them apart from the frames
                drift is measured on; it must hold exactly k indices. None: a seeded sample of k
                frames of the whole probe (:func:`select_landmarks`).
        """
        if landmark_idx is None:
            idx = select_landmarks(int(probe_frames.shape[0]), k, seed=seed, probe_hash=probe_hash)
        else:
            idx = torch.as_tensor(landmark_idx, dtype=torch.long).reshape(-1)
            if idx.numel() != k or bool((idx < 0).any()) or bool((idx >= probe_frames.shape[0]).any()):
                raise ConfigError(
                    f"landmark_idx must hold k={k} indices into a probe of {int(probe_frames.shape[0])} frames, "
                    f"got {idx.numel()}",
                    remediation="Use gauge.anchor_landmarks <= data.probe_frames / 2 (the landmark part).")
        was_training = reference_encoder.training
        reference_encoder.eval()
        try:
            frames = probe_frames[idx]
            outs = [reference_encoder(frames[s : s + batch_size]) for s in range(0, k, batch_size)]
        finally:
            reference_encoder.train(was_training)
        return cls(torch.cat(outs), idx, variant, singular_floor=singular_floor)

    def __call__(self, z_landmarks: torch.Tensor) -> torch.Tensor:
        if z_landmarks.shape != self.targets.shape:
            raise GaugeError(
                f"anchor expects landmark latents of shape {tuple(self.targets.shape)}, got {tuple(z_landmarks.shape)}"
            )
        # [precision] under bf16 autocast the landmark latents arrive in bf16: the loss is taken in
        # (at least) fp32, as every loss term is; an fp32 or fp64 run is unchanged.
        z = z_landmarks if z_landmarks.dtype in (torch.float32, torch.float64) else z_landmarks.float()
        t = self.targets.to(device=z.device, dtype=z.dtype)
        with full_precision(z):
            if self.variant == "A":
                return ((z - t) ** 2).sum(dim=-1).mean()
            q = differentiable_polar(z.mT @ t, singular_floor=self.singular_floor)
            eye = torch.eye(self.d, dtype=q.dtype, device=q.device)
            return ((q - eye) ** 2).sum()
