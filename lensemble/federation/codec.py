"""Wire format of a pseudo-gradient: fp32, or symmetric int8 over the whole flat Δ.

A payload is a ``dict[str, np.ndarray]`` (what a Flower ``ArrayRecord`` carries), always holding
the Δ flattened in sorted-name order (:func:`lensemble.federation.pseudograd.flatten`); the server
decodes it against the layout of its own global model, so names and shapes never travel.

- fp32:  ``{"fp32": float32 (n,)}`` — 4n bytes.
- int8:  ``{"q": int8 (n,), "scale": float32 (1,)}`` — n + 4 bytes.

int8 quantisation: ``scale = max|Δ|/127`` (1 when Δ is all zeros, so decoding is well defined),
``q = clamp(round(Δ/scale), −127, 127)``, ``Δ̂ = q·scale``. Each coordinate is off by at most
scale/2, hence ``‖Δ − Δ̂‖₂ ≤ √n·max|Δ|/254``. It is deterministic and adds no privacy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from lensemble.errors import RoundError
from lensemble.federation.pseudograd import Layout, StateDict, flatten, unflatten

FP32_KEYS = frozenset({"fp32"})
INT8_KEYS = frozenset({"q", "scale"})


def quantize_int8(flat: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Quantise a flat fp32 vector (n,) to ``(q int8 (n,), scale float32)``.

    The scale is rounded to fp32 first and ``q`` is computed against that rounded value, so the
    decoder (which only sees the fp32 scale) reconstructs exactly what the error bound assumes.
    """
    x = torch.as_tensor(flat).detach().to("cpu", torch.float64).reshape(-1).numpy()
    if not np.isfinite(x).all():
        raise RoundError("cannot quantise a non-finite pseudo-gradient")
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    scale = np.float32(peak / 127.0) if peak > 0 else np.float32(1.0)
    if scale == 0:  # peak below fp32's smallest subnormal×127: every q would be 0 anyway
        scale = np.float32(1.0)
    q = np.clip(np.rint(x / np.float64(scale)), -127, 127).astype(np.int8)
    return q, scale


def dequantize_int8(q: np.ndarray, scale: np.floating | float | np.ndarray) -> np.ndarray:
    """``q·scale`` as float32 (n,)."""
    s = np.float32(np.asarray(scale, dtype=np.float32).reshape(-1)[0])
    return q.astype(np.float32) * s


def encode_delta(delta: Mapping[str, torch.Tensor], *, quantize: bool = False) -> dict[str, np.ndarray]:
    """Encode a state-dict Δ into a payload (see the module docstring for the two forms)."""
    flat, _ = flatten(delta)
    if quantize:
        q, scale = quantize_int8(flat)
        return {"q": q, "scale": np.asarray([scale], dtype=np.float32)}
    return {"fp32": np.ascontiguousarray(flat.numpy(), dtype=np.float32)}


def decode_delta(payload: Mapping[str, np.ndarray], layout: Layout) -> StateDict:
    """Decode a payload back into named fp32 tensors laid out like ``layout``.

    A payload with unknown keys, the wrong dtype or the wrong length raises :class:`RoundError`.
    Values are not checked for finiteness here; :mod:`lensemble.federation.validation` does that.
    """
    keys = frozenset(payload)
    if keys == FP32_KEYS:
        arr = np.asarray(payload["fp32"])
        if arr.dtype != np.float32:
            raise RoundError(f"fp32 payload has dtype {arr.dtype}")
        flat = arr.reshape(-1)
    elif keys == INT8_KEYS:
        q, scale = np.asarray(payload["q"]), np.asarray(payload["scale"])
        if q.dtype != np.int8 or scale.dtype != np.float32 or scale.size != 1:
            raise RoundError(f"int8 payload malformed: q {q.dtype}, scale {scale.dtype}{scale.shape}")
        flat = dequantize_int8(q.reshape(-1), scale)
    else:
        raise RoundError(f"unknown payload keys {sorted(keys)}; expected {{fp32}} or {{q, scale}}")
    if flat.size != layout.numel:
        raise RoundError(f"payload has {flat.size} elements, the global model has {layout.numel}")
    return unflatten(torch.from_numpy(np.array(flat, dtype=np.float32)), layout)


def payload_flat(payload: Mapping[str, np.ndarray]) -> np.ndarray:
    """The flat Δ a payload decodes to, float32 (n,), without a layout (what secure aggregation masks)."""
    keys = frozenset(payload)
    if keys == FP32_KEYS:
        return np.asarray(payload["fp32"], dtype=np.float32).reshape(-1)
    if keys == INT8_KEYS:
        return dequantize_int8(np.asarray(payload["q"]).reshape(-1), payload["scale"])
    raise RoundError(f"unknown payload keys {sorted(keys)}; expected {{fp32}} or {{q, scale}}")


def payload_nbytes(payload: Mapping[str, np.ndarray]) -> int:
    """Bytes of array data in a payload (what goes on the wire, framing excluded)."""
    return int(sum(np.asarray(v).nbytes for v in payload.values()))


def payload_numel(payload: Mapping[str, np.ndarray]) -> int:
    """n, the number of Δ coordinates a payload carries."""
    if "fp32" in payload:
        return int(np.asarray(payload["fp32"]).size)
    if "q" in payload:
        return int(np.asarray(payload["q"]).size)
    raise RoundError(f"unknown payload keys {sorted(payload)}")


def quant_ratio(payload: Mapping[str, np.ndarray]) -> float:
    """Compression ratio ``4n / wire bytes`` (metric ``fed/quant_ratio``): 1 for fp32, ≈4 for int8."""
    nbytes = payload_nbytes(payload)
    n = payload_numel(payload)
    return (4.0 * n / nbytes) if nbytes else 1.0


__all__ = [
    "FP32_KEYS",
    "INT8_KEYS",
    "quantize_int8",
    "dequantize_int8",
    "encode_delta",
    "decode_delta",
    "payload_flat",
    "payload_nbytes",
    "payload_numel",
    "quant_ratio",
]
