"""Fault injection for tests and drills: a participant that misbehaves on a plan.

``faulty(participant_round, plan)`` wraps any participant function (same signature as
:func:`~lensemble.federation.participant.participant_round`) and, for the (round, partition)
pairs in ``plan``, crashes, hangs or returns a damaged reply instead. It is a plain Python object,
picklable when the wrapped function is importable, so the same plan works on every engine:

- framework-free: ``run_inprocess(cfg, run_dir, participant=faulty(participant_round, plan))``
  (or ``run_inprocess(..., fail=plan)``);
- Flower apps (in-process grid, Ray, real SuperNodes):
  ``make_client_app(participant=faulty(participant_round, plan))``.

Nothing of it lives in the config, so config hashes never depend on a drill.

``plan`` maps ``(round, partition_id)`` to a fault; ``round`` may be ``"*"`` (every round):

=========================== ====================================================================
``"crash"``                 raise :class:`~lensemble.errors.RoundError` before any work
``"hang"``                  block for ``hang_s`` seconds (default one hour), then raise: a node
                            that never answers within any sane deadline
``"slow:<s>"``              sleep ``s`` seconds, then answer normally
``"nan-delta"``             answer with every pseudo-gradient value NaN
``"nan-embeddings"``        answer with NaN probe embeddings (valid delta)
``"wrong-shape-embeddings"`` answer with probe embeddings of the wrong shape (valid delta)
``"wrong-round"``           answer with ``round_index`` one ahead of the asked round
``"scale:<k>"``             answer with the pseudo-gradient multiplied by ``k`` (finite, right
                            shape: a poisoned or broken update only the norm bound catches)
=========================== ====================================================================

``"timeout"`` is understood by the framework-free engine only (``run_inprocess(fail=...)``): the
reply is computed but counted as arriving after the deadline.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lensemble.errors import RoundError

FAULTS = ("crash", "hang", "slow", "nan-delta", "nan-embeddings", "wrong-shape-embeddings", "wrong-round", "scale")

FaultPlan = Mapping[tuple[int | str, int], str]


def _kind(fault: str) -> str:
    return fault.split(":", 1)[0]


def check_plan(plan: FaultPlan, *, extra: tuple[str, ...] = ()) -> dict[tuple[int | str, int], str]:
    """The plan as a plain dict; ValueError for an unknown fault or a malformed key."""
    out = {}
    for key, fault in dict(plan or {}).items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ValueError(f"fault plan keys are (round, partition_id), got {key!r}")
        if _kind(str(fault)) not in FAULTS + extra:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS + extra)}")
        if _kind(fault) in ("slow", "scale"):
            float(fault.split(":", 1)[1])  # "slow:<seconds>", "scale:<factor>"
        out[(key[0] if key[0] == "*" else int(key[0]), int(key[1]))] = str(fault)
    return out


def fault_for(plan: FaultPlan, t: int, partition_id: int) -> str | None:
    """The fault planned for round ``t`` and ``partition_id`` (an exact round wins over "*")."""
    return plan.get((int(t), int(partition_id))) or plan.get(("*", int(partition_id)))


@dataclasses.dataclass(frozen=True)
class Faulty:
    """``participant`` with the faults of ``plan`` (see the module docstring)."""

    participant: Callable[..., Any]
    plan: dict
    hang_s: float = 3600.0

    def __call__(self, cfg, node, global_arrays, round_config, extras=None):
        t = int(round_config["round"])
        fault = fault_for(self.plan, t, node.partition_id)
        kind = _kind(fault) if fault else None
        if kind == "crash":
            raise RoundError(f"injected crash of partition {node.partition_id} in round {t}")
        if kind == "hang":
            time.sleep(self.hang_s)
            raise RoundError(f"injected hang of partition {node.partition_id} ended")
        if kind == "slow":
            time.sleep(float(fault.split(":", 1)[1]))
        reply = self.participant(cfg, node, global_arrays, round_config, extras)
        if kind == "nan-delta":
            # fp32 form: every value NaN; int8 form: a NaN scale makes every decoded value NaN
            reply.payload = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
                             for k, v in reply.payload.items()}
        elif kind == "scale":
            # fp32 form: every value × k; int8 form: the scale × k (the decoded Δ is k times larger)
            k = float(fault.split(":", 1)[1])
            reply.payload = {key: (v * k).astype(v.dtype) if v.dtype.kind == "f" else v
                             for key, v in reply.payload.items()}
        elif kind == "nan-embeddings":
            reply.probe_embeddings = np.full_like(reply.probe_embeddings, np.nan)
        elif kind == "wrong-shape-embeddings":
            emb = reply.probe_embeddings
            reply.probe_embeddings = np.zeros((emb.shape[0] + 1, emb.shape[1] + 1), dtype=np.float32)
        elif kind == "wrong-round":
            reply.round_index = t + 1
        return reply


def faulty(participant: Callable[..., Any], plan: FaultPlan, *, hang_s: float = 3600.0) -> Faulty:
    """Wrap ``participant`` so it misbehaves as ``plan`` says (see the module docstring)."""
    return Faulty(participant, check_plan(plan), float(hang_s))


__all__ = ["FAULTS", "FaultPlan", "Faulty", "faulty", "fault_for", "check_plan"]
