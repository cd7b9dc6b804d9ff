"""JSONL metrics sink with stable keys (DESIGN.md §8).

One JSON object per line: ``{"step": int, "time": float, <key>: scalar, ...}``. The sink accepts
only scalars and short strings: tensors, arrays, lists and dicts are refused with
:class:`ResidencyViolation`, because a metrics file is shared and must never carry data.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from pathlib import Path

from lensemble.errors import ResidencyViolation

# Keys with a fixed meaning across runs; other keys are allowed under a known family prefix.
STABLE_KEYS = frozenset({
    "gauge/drift_angle_deg", "gauge/procrustes_residual", "gauge/effective_dim",
    "fed/comm_bytes", "fed/round_seconds", "fed/participants", "fed/quant_ratio",
    "eval/success_rate", "eval/planning_samples", "eval/time_per_action_ms", "dp/epsilon",
})
FAMILIES = ("loss/", "gauge/", "fed/", "eval/", "dp/", "train/", "data/", "run/")
_MAX_STR = 256


def check_scalar(key: str, value) -> float | int | str | bool | None:
    """Return ``value`` if it is a scalar the sink may write, else raise ResidencyViolation."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else str(f)  # JSON has no NaN/inf; keep them visible
    if isinstance(value, str):
        if len(value) > _MAX_STR:
            raise ResidencyViolation(f"metric {key!r} is a {len(value)}-character string; only short labels are allowed")
        return value
    kind = type(value).__module__ + "." + type(value).__qualname__
    raise ResidencyViolation(
        f"metric {key!r} is a {kind}; the metrics sink accepts only scalars",
        remediation="log a scalar summary (e.g. .item(), a norm or a mean), never a tensor or array",
    )


class MetricsSink:
    """Append-only JSONL writer. ``log(step, {key: scalar})`` writes one flushed line."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", buffering=1)

    def log(self, step: int, metrics: dict, **context) -> dict:
        record = {"step": int(step), "time": round(time.time(), 3)}
        for key, value in {**context, **metrics}.items():
            if not isinstance(key, str):
                raise ResidencyViolation(f"metric key {key!r} is not a string")
            if "/" in key and not key.startswith(FAMILIES):
                raise ResidencyViolation(f"metric key {key!r} is outside the known families {FAMILIES}")
            record[key] = check_scalar(key, value)
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        return record

    def close(self) -> None:
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL metrics file into a list of dicts."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
