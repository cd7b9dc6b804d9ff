"""One Intel MKL code path for the simulator on every CPU, so the same settings give the same frames.

torch calls Intel MKL for some CPU kernels, among them the vectorised math the TwoRoom renderer
uses (stable-worldmodel draws its dots with ``torch.exp`` and truncates them to uint8). MKL picks a
code path per CPU at its first call: AVX-512 kernels on an AVX-512 Intel CPU, a generic one on an
AMD CPU. The paths round differently in the last bits, and the truncation to uint8 turns that into
other pixels. Measured (issue 32), with identical packages (constraints.txt): the room study's
seed-0 probe hashed 1391d231… on an Intel Xeon with AVX-512 and 67e78ea0… (the committed study's)
on an AMD EPYC; on the Intel machine ``MKL_CBWR=COMPATIBLE`` gave 67e78ea0… again and
``MKL_CBWR=AVX2`` a third hash (bde32c5f…), while numpy's SIMD dispatch, OpenBLAS's core type,
ATen's CPU capability and OpenCV's optimised paths changed nothing.

So data collection runs its simulators in worker processes started with MKL's conditional
numerical reproducibility mode set to ``COMPATIBLE`` (:func:`collection_environment`), and each
worker checks that the mode took (:func:`mkl_mode`). Only there: the same mode in training costs
2.4× the CPU time of a 300-step warm start on the AVX-512 machine (221 s against 90 s) and still
does not make training bit-identical across CPUs (oneDNN's convolutions choose their own paths),
so trained weights and evaluation stay machine-dependent and are recorded with
:func:`numerics_record`.

MKL reads the mode once, at its first call in a process (``mkl_serv_cbwr_set`` fails with
``MKL_CBWR_ERR_MODE_CHANGE_FAILURE`` afterwards): that is why the collection uses fresh processes
rather than forks of a parent that may have trained already.
"""

from __future__ import annotations

import ctypes
import platform
from functools import lru_cache
from pathlib import Path

#: The environment variable MKL reads at its first call, and the mode collection pins.
MKL_CBWR_VAR = "MKL_CBWR"
MKL_CBWR_MODE = "COMPATIBLE"
#: mkl_cbwr_get(MKL_CBWR_BRANCH) values (mkl_service.h) -> names
_BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
             8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1",
             14: "AVX512_E1"}
_MKL_CBWR_BRANCH = 1


@lru_cache(maxsize=1)
def _mkl_service():
    """torch's statically linked MKL service functions, or None (a torch build without MKL)."""
    import torch

    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        lib = ctypes.CDLL(str(path))
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_int
    get.argtypes = [ctypes.c_int]
    return get


def mkl_mode() -> str:
    """The MKL code-path mode in force in this process: ``"COMPATIBLE"``, ``"BRANCH_OFF"`` (MKL's
    automatic choice), …; ``"no-mkl"`` when torch was built without MKL (nothing to pin)."""
    get = _mkl_service()
    if get is None:
        return "no-mkl"
    value = int(get(_MKL_CBWR_BRANCH))
    return _BRANCHES.get(value, str(value))


def collection_environment() -> dict[str, str]:
    """The environment variables a collection worker process must start with."""
    return {MKL_CBWR_VAR: MKL_CBWR_MODE}


def cpu_flags(path: str | Path = "/proc/cpuinfo") -> tuple[set[str], str]:
    """The first CPU's feature flags and model name from ``path`` (empty on systems without it)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return set(), "unknown CPU"
    flags: set[str] = set()
    model = "unknown CPU"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:  # x86 says "flags", aarch64 "Features"
            flags = set(value.split())
        elif key in ("model name", "cpu model") and model == "unknown CPU":
            model = value.strip()
    return flags, model


def cpu_model() -> str:
    """The CPU's model name (:func:`cpu_flags`), or ``platform.processor()`` where there is no cpuinfo."""
    model = cpu_flags()[1]
    return model if model != "unknown CPU" else (platform.processor() or "unknown CPU")


def numerics_record() -> dict[str, str]:
    """What decides this process's CPU numerics: the CPU, ATen's kernel level and MKL's mode.

    ``{"cpu": <model name>, "torch_cpu_capability": "AVX512" | "AVX2" | …, "mkl_mode": …}``.
    """
    import torch

    return {"cpu": cpu_model(), "torch_cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "mkl_mode": mkl_mode()}


__all__ = ["MKL_CBWR_MODE", "MKL_CBWR_VAR", "collection_environment", "cpu_flags", "cpu_model", "mkl_mode", "numerics_record"]
