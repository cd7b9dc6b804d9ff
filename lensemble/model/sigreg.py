"""SIGReg: a sketched Epps–Pulley test pulling the latent distribution towards N(0, I_d).

Definition used here, for latents Z (N, d) and a sketch A (d, S) of unit-norm directions:

1. project ``P = Z A`` (N, S) and centre each column, ``U = P - mean(P)``. The columns are NOT
   divided by their standard deviation: a standardised test is blind to scale, so latents that
   shrink towards zero or onto a low-rank subspace would pass it.
2. For each direction s and knot t_k on an evenly spaced grid over [0, t_max], compare the
   empirical characteristic function ``φ̂_s(t) = mean_n exp(i t U_ns)`` with the standard normal
   one ``φ(t) = exp(-t²/2)``: ``err_s(t) = (Re φ̂_s(t) - φ(t))² + (Im φ̂_s(t))²``.
3. Integrate over t with trapezoid weights times the Gaussian window ``exp(-t²/2)``
   (t ≥ 0 suffices: the integrand is even in t).
4. Multiply by N and average over the S directions.

Scaling: for N i.i.d. N(0,1) samples ``E|φ̂(t) - φ(t)|² = (1 - φ(t)²) / N``, and centring removes
the first-order (mean-shift) part, giving ``(1 - φ(t)² (1 + t²)) / N`` to leading order. Step 4 thus
makes the null mean independent of the batch size: about 0.29 for 17 knots on [0, 3] (see
:func:`sigreg_null_mean`; measured 0.28-0.29 for N = 256..4096, d = 64, S = 512). Departures from
normality grow linearly with N (a 0.1-scaled Gaussian batch of 256 scores ~50), so λ_sig ≈ 0.1 means
the same thing at any batch size. The N scaling is the LeWM/LeJEPA convention (the unscaled
average is ~1/N smaller), but the *constant* is not stable-worldmodel's; see below.

Scale against stable-worldmodel 0.1.1 (``stable_worldmodel.wm.loss.SIGReg``, the statistic LeWM's
published λ = 0.09 multiplies). swm weights the knots with ``2·dt`` (``dt`` at the two ends), i.e. it
integrates over the whole line t ∈ [−t_max, t_max]; this module integrates over [0, t_max]
(trapezoid ``dt``, ``dt/2`` at the ends). swm also does not centre the projections. Hence, measured
with the same sketch (tests/unit/test_sigreg.py, the installed package):

* on zero-mean latents, whatever their law (Gaussian, shrunk, rank-1): swm = :data:`SWM_SCALE` × this
  statistic, exactly up to float rounding (the centring then changes nothing);
* at the null level (i.i.d. N(0, I), not centred by swm) swm reads ≈ 1.0 against ≈ 0.27 here, about
  3.8×: the extra factor is the mean-shift term that centring removes here.

The numerics here are kept (changing them would change every trained model); instead λ_sig is
restated on swm's scale with :func:`lambda_sig_on_swm_scale`: the loss term λ_sig · SIGReg here
equals (λ_sig / 2) · SIGReg_swm. The default λ_sig = 0.1 is 0.05 on swm's scale, and LeWM's
published 0.09 corresponds to λ_sig = 0.18 here.

Statistics are computed in fp32 whatever the latents' dtype, also under bf16 autocast (``train.precision``).
"""

from __future__ import annotations

import torch

from lensemble.model.precision import full_precision


def make_sketch(d: int, num_directions: int, generator: torch.Generator) -> torch.Tensor:
    """Random sketch A (d, S), float32 on CPU, columns i.i.d. uniform on the unit sphere.

    Deterministic given the generator's seed (and the torch version), so every federated
    participant that seeds its generator with ``derive(root_seed, "sketch", round)`` gets the
    same A.
    """
    if d < 1 or num_directions < 1:
        raise ValueError(f"sketch needs d >= 1 and S >= 1, got d={d}, S={num_directions}")
    a = torch.randn(d, num_directions, generator=generator, dtype=torch.float32)
    return a / a.norm(dim=0, keepdim=True).clamp_min(1e-12)


def _knot_weights(knots: int, t_max: float, device, dtype=torch.float32):
    """Knots t (K,), target φ(t) (K,) and integration weights (trapezoid × Gaussian window)."""
    if knots < 2:
        raise ValueError(f"need at least 2 knots, got {knots}")
    t = torch.linspace(0.0, float(t_max), knots, device=device, dtype=dtype)
    trap = torch.full((knots,), float(t_max) / (knots - 1), device=device, dtype=dtype)
    trap[0] = trap[-1] = trap[0] / 2
    phi = torch.exp(-0.5 * t * t)
    return t, phi, trap * phi


def sigreg(
    z: torch.Tensor, sketch: torch.Tensor, *, knots: int = 17, t_max: float = 3.0
) -> torch.Tensor:
    """Sketched Epps–Pulley statistic (scalar, fp32, differentiable w.r.t. z).

    z: (N, d) latents (any leading batch shape is flattened into N); sketch: (d, S) unit columns.
    Null level ≈ :func:`sigreg_null_mean` (~0.29 at the defaults), independent of N; collapsed or shrunken
    latents give values that grow like N.
    """
    if z.shape[-1] != sketch.shape[0]:
        raise ValueError(f"latent dim {z.shape[-1]} does not match sketch rows {sketch.shape[0]}")
    z = z.reshape(-1, z.shape[-1]).to(torch.float32)
    n = z.shape[0]
    if n < 2:
        raise ValueError("SIGReg needs at least 2 latents")
    with full_precision(z):  # [precision] under bf16 autocast the two matmuls would run in bf16
        proj = z @ sketch.to(device=z.device, dtype=torch.float32)  # (N, S)
        proj = proj - proj.mean(dim=0, keepdim=True)
        t, phi, w = _knot_weights(knots, t_max, z.device)
        arg = proj.unsqueeze(-1) * t  # (N, S, K)
        re = torch.cos(arg).mean(dim=0)  # (S, K)
        im = torch.sin(arg).mean(dim=0)
        err = (re - phi).square() + im.square()
        return n * (err @ w).mean()


def sigreg_null_mean(*, knots: int = 17, t_max: float = 3.0) -> float:
    """Leading-order expected :func:`sigreg` value when the latents are i.i.d. N(0, I), on the
    same knot grid: Σ_k w_k (1 - φ(t_k)² (1 + t_k²)) (the t² term is what centring removes).
    The "healthy" reference line for logs and tests; a finite batch sits within a few percent."""
    t, phi, w = _knot_weights(knots, t_max, "cpu", torch.float64)
    return float((w * (1 - phi.square() * (1 + t.square()))).sum())


SWM_SCALE = 2.0
"""stable-worldmodel 0.1.1's SIGReg divided by :func:`sigreg` on zero-mean latents (same sketch,
17 knots on [0, 3]): swm's knot weights are twice these (it integrates over the whole line). A power
of two, so restating λ_sig on swm's scale is exact."""


def lambda_sig_on_swm_scale(lambda_sig: float) -> float:
    """The weight that gives the same loss term with stable-worldmodel's statistic:
    λ_sig · sigreg(z) == lambda_sig_on_swm_scale(λ_sig) · SIGReg_swm(z) on zero-mean latents."""
    return float(lambda_sig) / SWM_SCALE


def lambda_sig_from_swm_scale(lambda_swm: float) -> float:
    """The inverse: λ_sig here for a weight stated on swm's scale (LeWM's 0.09 -> 0.18)."""
    return float(lambda_swm) * SWM_SCALE


def sigreg_swm(z: torch.Tensor, sketch: torch.Tensor, *, knots: int = 17, t_max: float = 3.0) -> torch.Tensor:
    """stable-worldmodel 0.1.1's statistic computed with *this* sketch (no centring, whole-line
    weights), for comparisons and logs; training uses :func:`sigreg`. Equals the package's
    ``SIGReg.forward`` when its random directions equal ``sketch``."""
    if z.shape[-1] != sketch.shape[0]:
        raise ValueError(f"latent dim {z.shape[-1]} does not match sketch rows {sketch.shape[0]}")
    z = z.reshape(-1, z.shape[-1]).to(torch.float32)
    t, phi, w = _knot_weights(knots, t_max, z.device)
    with full_precision(z):
        arg = (z @ sketch.to(device=z.device, dtype=torch.float32)).unsqueeze(-1) * t
        err = (torch.cos(arg).mean(dim=0) - phi).square() + torch.sin(arg).mean(dim=0).square()
        return z.shape[0] * (err @ (SWM_SCALE * w)).mean()


__all__ = ["SWM_SCALE", "lambda_sig_from_swm_scale", "lambda_sig_on_swm_scale", "make_sketch", "sigreg",
           "sigreg_null_mean", "sigreg_swm"]
