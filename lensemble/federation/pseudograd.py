"""Pseudo-gradients: what one participant learned in one round, as flat, sorted tensors.

A pseudo-gradient is what one participant learned in one round: ``Δ = local − global`` over the
model's state dict, in fp32. Everything here works on plain ``dict[str, torch.Tensor]`` and walks
keys in sorted order, so the flat layout is the same on every machine.

Only floating-point entries take part. Integer or boolean buffers (a BatchNorm step counter, say)
have no meaningful difference; they are left out of Δ and the server keeps its own copy unchanged
(see :class:`lensemble.federation.outer.OuterOptimizer`). The world model normalises with
LayerNorm, so in practice there are none.

What a participant then releases (clip, DP noise, int8) is :mod:`lensemble.federation.release`.
"""

from __future__ import annotations

import math
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


__all__ = [
    "StateDict",
    "Layout",
    "pseudo_gradient",
    "flatten",
    "unflatten",
    "l2_norm",
    "clip",
]
