"""Pseudo-gradients and the participant-side release pipeline.

A pseudo-gradient is what one participant learned in one round: ``Δ = local − global`` over the
model's state dict, in fp32. Everything here works on plain ``dict[str, torch.Tensor]`` and walks
keys in sorted order, so the flat layout is the same on every machine.

Only floating-point entries take part. Integer or boolean buffers (a BatchNorm step counter, say)
have no meaningful difference; they are left out of Δ and the server keeps its own copy unchanged
(see :class:`lensemble.federation.outer.OuterOptimizer`). The world model normalises with
LayerNorm, so in practice there are none.

Release order on a participant (DESIGN §4, INV-ALIGN-BEFORE-RELEASE): the gauge package aligns the
local weights and re-differences first; :func:`participant_pipeline` then clips, adds DP noise and
optionally quantises. Nothing that leaves the silo may skip those steps.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from lensemble.errors import RoundError

StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Layout:
    """Where each tensor lives in a flat vector: names in sorted order with their shapes.

    ``numel`` is the total length n of the flat vector.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor]) -> Layout:
        """The layout of the floating-point entries of ``state`` (sorted by name)."""
        names = tuple(sorted(k for k, v in state.items() if v.is_floating_point()))
        return cls(names, tuple(tuple(state[k].shape) for k in names))


def pseudo_gradient(local_sd: Mapping[str, torch.Tensor], global_sd: Mapping[str, torch.Tensor]) -> StateDict:
    """``Δ = local − global`` for every floating-point entry, as fp32 CPU tensors.

    Both state dicts must have the same keys, and each pair the same shape and the same
    float-ness; anything else is a :class:`RoundError` (a participant trained a different model).
    The result's keys are the sorted floating-point keys. The difference is taken in fp64 and
    rounded once to fp32, so it does not depend on the dtype the two sides happen to hold.
    """
    if set(local_sd) != set(global_sd):
        missing = sorted(set(global_sd) - set(local_sd))
        extra = sorted(set(local_sd) - set(global_sd))
        raise RoundError(
            f"local and global state dicts differ: missing {missing[:5]}, extra {extra[:5]}",
            remediation="Participants must train the exact architecture the server sent.",
        )
    delta: StateDict = {}
    for name in sorted(global_sd):
        loc, glo = local_sd[name], global_sd[name]
        if loc.shape != glo.shape:
            raise RoundError(
                f"shape mismatch for {name!r}: local {tuple(loc.shape)} vs global {tuple(glo.shape)}",
                remediation="Participants must train the exact architecture the server sent.",
            )
        if loc.is_floating_point() != glo.is_floating_point():
            raise RoundError(f"dtype kind mismatch for {name!r}: {loc.dtype} vs {glo.dtype}")
        if not glo.is_floating_point():
            continue
        d = loc.detach().to("cpu", torch.float64) - glo.detach().to("cpu", torch.float64)
        delta[name] = d.to(torch.float32)
    return delta


def flatten(state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, Layout]:
    """Concatenate the floating-point entries of ``state`` in sorted-name order.

    Returns ``(flat, layout)``: ``flat`` is an fp32 CPU vector of length ``layout.numel``.
    """
    layout = Layout.of(state)
    if not layout.names:
        return torch.zeros(0, dtype=torch.float32), layout
    flat = torch.cat([state[k].detach().to("cpu", torch.float32).reshape(-1) for k in layout.names])
    return flat, layout


def unflatten(flat: torch.Tensor | np.ndarray, layout: Layout) -> StateDict:
    """Inverse of :func:`flatten`: split a length-n vector back into named fp32 tensors."""
    flat_t = torch.as_tensor(flat).reshape(-1)
    if flat_t.numel() != layout.numel:
        raise RoundError(f"flat vector has {flat_t.numel()} elements, layout needs {layout.numel}")
    flat_t = flat_t.to(torch.float32)
    out: StateDict = {}
    offset = 0
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        n = math.prod(shape)
        # clone so the pieces do not alias one shared buffer (a later in-place op on one
        # parameter must not leak into its neighbours)
        out[name] = flat_t[offset : offset + n].reshape(shape).clone()
        offset += n
    return out


def l2_norm(delta: Mapping[str, torch.Tensor]) -> float:
    """Global L2 norm over all floating-point entries (accumulated in fp64)."""
    total = 0.0
    for name in sorted(delta):
        t = delta[name]
        if t.is_floating_point():
            total += float(torch.sum(t.detach().to(torch.float64) ** 2))
    return math.sqrt(total)


def clip(delta: Mapping[str, torch.Tensor], clip_norm: float) -> tuple[StateDict, float]:
    """Scale ``delta`` by ``min(1, C/‖Δ‖)`` so its global L2 norm is at most ``clip_norm`` (C).

    Returns ``(clipped, norm_before)``. Clipping bounds one participant's influence per round,
    which is what the DP noise is calibrated against.
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    norm = l2_norm(delta)
    factor = 1.0 if norm <= clip_norm else clip_norm / norm
    clipped = {k: (v.to(torch.float32) * factor) for k, v in sorted(delta.items())}
    # fp32 rounding of the product can land a hair above C; shave it so the bound is exact,
    # since the privacy guarantee is stated for ‖Δ‖ ≤ C.
    after = l2_norm(clipped)
    if after > clip_norm:
        shave = clip_norm / after * (1.0 - 1e-7)
        clipped = {k: v * shave for k, v in clipped.items()}
    return clipped, norm


def secure_generator() -> torch.Generator:
    """A CPU generator seeded from the OS CSPRNG (``secrets``), never from the run seed.

    DP noise must be unknown to everyone but the participant that drew it: if it could be
    regenerated from the (shared, logged) run seed, the server could subtract it and the
    guarantee would be void. The price is that noised runs are not bit-reproducible; that is
    intended.
    """
    g = torch.Generator(device="cpu")
    g.manual_seed(secrets.randbits(63))
    return g


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
    rng: torch.Generator | None = None,
) -> Release:
    """Clip, noise and (optionally) quantise an already-aligned pseudo-gradient, in that order.

    - clip: ``Δ·min(1, C/‖Δ‖)`` when ``clip_norm`` (C) is given;
    - noise: ``N(0, σ²C²)`` per coordinate when ``noise_multiplier`` (σ) > 0; requires C;
    - quantise: symmetric int8 over the whole flat Δ (not a privacy mechanism, only bandwidth).

    ``rng`` defaults to :func:`secure_generator`. Pass one only in tests, and never one derived
    from the run seed (the noise would then be replayable by the server).
    A non-finite Δ (diverged local training) raises :class:`RoundError` instead of being sent.
    """
    # local import: codec builds on this module's flatten/Layout
    from lensemble.federation import codec

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
        gen = rng if rng is not None else secure_generator()
        flat, layout = flatten(work)
        noise = torch.randn(flat.shape, generator=gen, dtype=torch.float32)
        work = unflatten(flat + noise * noise_std, layout)

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


__all__ = [
    "StateDict",
    "Layout",
    "pseudo_gradient",
    "flatten",
    "unflatten",
    "l2_norm",
    "clip",
    "secure_generator",
    "Release",
    "participant_pipeline",
]
