"""The participant-side release pipeline: clip, DP noise, int8 — what may leave a silo.

Release order on a participant (DESIGN §4, INV-ALIGN-BEFORE-RELEASE): the gauge package aligns the
local weights and re-differences first; :func:`participant_pipeline` then clips, adds DP noise and
optionally quantises. Nothing that leaves the silo may skip those steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from lensemble.errors import RoundError
from lensemble.federation import codec
from lensemble.federation.pseudograd import Layout, StateDict, clip, flatten, l2_norm, unflatten


def secure_standard_normal(n: int) -> np.ndarray:
    """``n`` independent N(0, 1) draws in float64, straight from the OS CSPRNG.

    Box–Muller over ``os.urandom`` bytes: two 53-bit uniforms in (0, 1) per pair of draws, so the
    stream is as unpredictable as the kernel's CSPRNG and never derived from the (shared, logged)
    run seed. If the noise could be regenerated from the run seed the server could subtract it and
    the guarantee would be void; the price is that noised runs are not bit-reproducible, which is
    intended. About 16 random bytes per draw: ~30 ms for a 2M-parameter update.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pairs = (n + 1) // 2
    raw = np.frombuffer(os.urandom(16 * pairs), dtype="<u8").reshape(pairs, 2)
    u = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # open interval (0, 1)
    radius = np.sqrt(-2.0 * np.log(u[:, 0]))
    angle = 2.0 * np.pi * u[:, 1]
    return np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1)[:n]


NoiseSource = Callable[[int], np.ndarray]


def _noise(rng, n: int) -> np.ndarray:
    if rng is None:
        return secure_standard_normal(n)
    if isinstance(rng, np.random.Generator):
        return rng.standard_normal(n, dtype=np.float64)
    return np.asarray(rng(n), dtype=np.float64)


@dataclass(frozen=True)
class Release:
    """What :func:`participant_pipeline` hands back.

    ``payload``: the wire form (see :mod:`lensemble.federation.codec`), the only thing that leaves.
    ``delta``: the update as the server will decode it (dequantised when quantised), fp32.
    ``norm_before_clip`` / ``norm_after_clip``: global L2 norms; the second is pre-noise.
    ``noise_std``: standard deviation σ·C of the added Gaussian noise per coordinate (0 if none).
    ``nbytes``: wire size of ``payload``.
    """

    payload: dict[str, np.ndarray]
    delta: StateDict
    norm_before_clip: float
    norm_after_clip: float
    noise_std: float
    quantized: bool
    nbytes: int


def participant_pipeline(
    delta: Mapping[str, torch.Tensor],
    *,
    clip_norm: float | None = None,
    noise_multiplier: float = 0.0,
    quantize: bool = False,
    rng: np.random.Generator | NoiseSource | None = None,
) -> Release:
    """Clip, noise and (optionally) quantise an already-aligned pseudo-gradient, in that order.

    - clip: ``Δ·min(1, C/‖Δ‖)`` when ``clip_norm`` (C) is given;
    - noise: ``N(0, σ²C²)`` per coordinate when ``noise_multiplier`` (σ) > 0; requires C. Drawn
      and added in float64 (the clipped Δ is widened first), then rounded once to float32 for
      the wire, which is post-processing and costs no privacy;
    - quantise: symmetric int8 over the whole flat Δ (not a privacy mechanism, only bandwidth).

    ``rng`` defaults to :func:`secure_standard_normal`. Pass a numpy Generator (or a function
    ``n -> float64 (n,)``) only in tests, never one derived from the run seed (the noise would
    then be replayable by the server).
    A non-finite Δ (diverged local training) raises :class:`RoundError` instead of being sent.
    """
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if noise_multiplier > 0 and clip_norm is None:
        raise ValueError("DP noise needs clip_norm: the noise scale is σ·C")
    for name in sorted(delta):
        if delta[name].is_floating_point() and not bool(torch.isfinite(delta[name]).all()):
            raise RoundError(
                f"pseudo-gradient entry {name!r} is not finite; refusing to release it",
                remediation="Local training diverged: lower the inner learning rate or H.",
            )

    work = {k: v.detach().to("cpu", torch.float32) for k, v in sorted(delta.items()) if v.is_floating_point()}
    norm_before = l2_norm(work)
    if clip_norm is not None:
        work, _ = clip(work, clip_norm)
    norm_after = l2_norm(work)

    noise_std = 0.0
    if noise_multiplier > 0:
        assert clip_norm is not None
        noise_std = float(noise_multiplier) * float(clip_norm)
        flat, layout = flatten(work)
        noise = torch.from_numpy(_noise(rng, flat.numel()))
        noised = flat.to(torch.float64) + noise * noise_std  # float64: the noise keeps its low bits
        work = unflatten(noised.to(torch.float32), layout)

    payload = codec.encode_delta(work, quantize=quantize)
    released = codec.decode_delta(payload, Layout.of(work))
    return Release(
        payload=payload,
        delta=released,
        norm_before_clip=norm_before,
        norm_after_clip=norm_after,
        noise_std=noise_std,
        quantized=quantize,
        nbytes=codec.payload_nbytes(payload),
    )


__all__ = ["secure_standard_normal", "NoiseSource", "Release", "participant_pipeline"]
