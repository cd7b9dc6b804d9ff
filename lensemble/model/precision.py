"""Numeric precision of training and planning: ``fp32``, ``bf16`` or ``auto`` (``train.precision``, ``eval.precision``).

``bf16`` is :func:`torch.autocast` with ``dtype=torch.bfloat16`` around the model's forward passes:
matrix products (linear layers, attention, convolutions) take bf16 inputs and accumulate in fp32 on
the CPU's bf16 matrix units (AMX tiles, AVX512-BF16 dot products) or a GPU's tensor cores; the
weights stay fp32 (the optimizer updates fp32 master weights, checkpoints are fp32), and losses, the
SIGReg statistic, the pooled summaries and the planner's cost are computed in fp32
(:func:`full_precision` switches autocast off around them). ``fp32`` does nothing at all, so fp32
runs are bitwise what they were before the option existed.

bf16 only pays where the hardware multiplies bf16 natively. Elsewhere torch runs bf16 matrix products
in a scalar fallback: measured on an AVX2-only AMD EPYC (torch 2.14, one thread), a 4096 x 192 x 768
matmul ran at 36 GFLOP/s in fp32 and 0.9 in bf16 (40x slower), a planner rollout 7x slower; on a
Zen 4 EPYC with AVX512-BF16 but no AMX, bf16 matmuls ran 2.1x fp32's peak and a training step and a
planning call 1.46x and 1.59x faster (docs/results/bf16-avx512), so AVX512-BF16 counts. So a
requested ``bf16`` is checked against the machine (:func:`bf16_support`): without bf16 matrix units
it falls back to fp32 with a :class:`PrecisionFallback` warning that names the cause, unless
``LENSEMBLE_FORCE_BF16=1`` asks for bf16 numerics anyway (numerics studies; slow). ``auto`` asks
for whichever is fast on the device: bf16 with bf16 matrix units, fp32 without them, no warning
(what ran is recorded: ``EvalReport.precision``).
"""

from __future__ import annotations

import functools
import os
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import torch
import torch.nn.functional as F

from lensemble.config.schema import Precision
from lensemble.numerics import cpu_flags  # re-exported: the one /proc/cpuinfo reader

PRECISIONS: tuple[str, ...] = get_args(Precision)  # the schema's Literal is the one list
#: Environment variable: "1" runs a requested bf16 even where the device has no bf16 matrix units.
FORCE_ENV = "LENSEMBLE_FORCE_BF16"
#: CPU flags (/proc/cpuinfo) of bf16 matrix units: x86 AMX tiles and AVX512-BF16 dot products;
#: aarch64 lists its BF16 dot-product extension as "bf16".
CPU_BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16", "bf16")


class PrecisionFallback(UserWarning):
    """A requested bf16 runs in fp32 because the device has no bf16 matrix units (or the reverse,
    forced with ``LENSEMBLE_FORCE_BF16=1``). The message names the field, the cause and the fix."""


@dataclass(frozen=True)
class Bf16Support:
    """Whether a device multiplies bf16 natively (``available``) and why (``reason``, one phrase)."""

    available: bool
    reason: str


def _torch_cpu_probe(name: str) -> bool:
    # torch.cpu._is_amx_tile_supported / _is_avx512_bf16_supported (cpuinfo + OS tile permission);
    # private in torch 2.14, so a missing one counts as "no" rather than an error.
    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # noqa: BLE001 - a probe that cannot run is a "no"
        return False


def cpu_bf16_support(path: str | Path = "/proc/cpuinfo") -> Bf16Support:
    """bf16 matrix units on this CPU: AMX (``amx_bf16``), AVX512-BF16 or aarch64 BF16, from the
    flags in ``path`` or torch's own CPU probes (either suffices)."""
    flags, model = cpu_flags(path)
    found = [f for f in CPU_BF16_FLAGS if f in flags]
    if _torch_cpu_probe("_is_amx_tile_supported") and "amx_bf16" not in found:
        found.append("amx (torch)")
    if _torch_cpu_probe("_is_avx512_bf16_supported") and "avx512_bf16" not in found:
        found.append("avx512_bf16 (torch)")
    if found:
        return Bf16Support(True, f"{model} has bf16 matrix units ({', '.join(found)})")
    return Bf16Support(False, f"{model} has no bf16 matrix units (none of {', '.join(CPU_BF16_FLAGS)} in its "
                              f"CPU flags; torch's CPU capability: {torch.backends.cpu.get_cpu_capability()})")


@functools.lru_cache(maxsize=None)
def _cpu_support_cached() -> Bf16Support:
    return cpu_bf16_support()


def bf16_support(device: str | torch.device = "cpu") -> Bf16Support:
    """Whether ``device`` (cpu | cuda[:N]) has bf16 matrix units; the CPU answer is cached per process."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return Bf16Support(False, "no CUDA device is visible")
        # including_emulation=False: Turing and older emulate bf16 (slower than their fp16/fp32)
        ok = torch.cuda.is_bf16_supported(including_emulation=False)
        name = torch.cuda.get_device_name(device)
        return Bf16Support(ok, f"{name} {'has' if ok else 'has no'} native bf16")
    return _cpu_support_cached()


def resolve_precision(requested: str, device: str | torch.device = "cpu", *, field: str = "precision") -> str:
    """The precision to run, "fp32" or "bf16": ``requested`` if the device supports it, else "fp32"
    with a :class:`PrecisionFallback` warning naming ``field`` (e.g. "train.precision") and the
    cause. "auto" is "bf16" where the device has bf16 matrix units and "fp32" elsewhere, silently.

    ``LENSEMBLE_FORCE_BF16=1`` keeps bf16 on a device without bf16 units (warned too: it is slow).
    """
    if requested not in PRECISIONS:
        raise ValueError(f"{field} must be one of {PRECISIONS}, got {requested!r}")
    if requested == "fp32":
        return "fp32"
    support = bf16_support(device)
    if support.available:
        return "bf16"
    if requested == "auto":  # asked for whatever is fast here: fp32 is the answer, not a fallback
        return "fp32"
    if os.environ.get(FORCE_ENV) == "1":
        warnings.warn(f"{field}=bf16 forced by {FORCE_ENV}=1 although {support.reason}: bf16 numerics, "
                      "expect it several times slower than fp32", PrecisionFallback, stacklevel=2)
        return "bf16"
    warnings.warn(f"{field}=bf16 requested but {support.reason}: running in fp32 instead (bf16 would run in "
                  f"torch's scalar fallback, several times slower). Set {field}=fp32 to silence this, or "
                  f"{FORCE_ENV}=1 to run bf16 anyway", PrecisionFallback, stacklevel=2)
    return "fp32"


def autocast(precision: str, device: str | torch.device = "cpu") -> AbstractContextManager:
    """The context a forward pass runs in: nothing for fp32 (bitwise the plain code), bf16 autocast
    on ``device``'s type otherwise. ``precision`` is an already resolved one (:func:`resolve_precision`)."""
    if precision == "fp32":
        return nullcontext()
    if precision != "bf16":
        raise ValueError(f"autocast takes a resolved precision (fp32 or bf16; resolve_precision), got {precision!r}")
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def full_precision(like: torch.Tensor) -> AbstractContextManager:
    """Autocast off on ``like``'s device inside the block: statistics and losses computed there stay
    fp32 (their inputs must be cast to fp32 by the caller). A no-op outside autocast."""
    return torch.autocast(like.device.type, enabled=False)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, **kwargs)``, except that bf16 inputs on the CPU run it
    in fp32 and return bf16: q (B, heads, Tq, hd), k and v (B, heads, Tk, hd) -> (B, heads, Tq, hd).

    The reason is speed, measured (``benchmarks/bench_precision.py``, AMX Xeon, torch 2.14, one
    thread): torch's CPU flash-attention kernel is slower in bf16 than in fp32 at this project's
    sequence lengths (17 encoder tokens, 3-6 predictor latents), its backward 12x slower (a CPU-preset
    training step 491 ms in bf16 against 347 ms in fp32; 231 ms with attention in fp32), and the
    planning call 607 -> 536 ms. The math backend in bf16 (``sdpa_kernel(MATH)``) was slower still
    (329 ms). The products around attention (qkv and output projections, the MLP) stay bf16. fp32
    inputs call SDPA unchanged, so fp32 runs are bitwise what they were; CUDA keeps its bf16 kernels.
    """
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        with full_precision(q):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


class emulate_bf16_matmuls:
    """``with torch.autocast("cpu", dtype=torch.bfloat16), emulate_bf16_matmuls():`` bf16 numerics at
    fp32 speed on a CPU without bf16 matrix units, for numerics studies only (examples/bf16_planner_success.py).

    Below autocast (a ``TorchDispatchMode``), every linear / matmul / convolution with a bf16 input
    runs on fp32 copies of its bf16 inputs and rounds its output to bf16: the products of bf16
    numbers are exact in fp32 and sum in fp32, as on AMX, so only the order of the additions (and
    where the bias is added) differs from a native bf16 kernel. Measured on a trained CPU-preset
    model: 3e-4 relative from torch's own bf16 kernels against 2.7e-3 between those and fp32 (the
    planner's rollout); 6x faster than torch's scalar bf16 fallback here. Every other op runs as is.
    """

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        aten = torch.ops.aten
        products = {aten.linear.default, aten.matmul.default, aten.mm.default, aten.addmm.default,
                    aten.bmm.default, aten.baddbmm.default, aten.convolution.default}

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in products and any(torch.is_tensor(a) and a.dtype == torch.bfloat16 for a in args):
                    up = [a.float() if torch.is_tensor(a) and a.dtype == torch.bfloat16 else a for a in args]
                    return func(*up, **kwargs).bfloat16()
                return func(*args, **kwargs)

        self._mode = _Mode()

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


__all__ = ["attention", "emulate_bf16_matmuls", "CPU_BF16_FLAGS", "FORCE_ENV", "PRECISIONS", "Bf16Support", "PrecisionFallback", "autocast",
           "bf16_support", "cpu_bf16_support", "cpu_flags", "full_precision", "resolve_precision"]
