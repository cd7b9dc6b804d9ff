"""Server side of a DiLoCo round: deterministic averaging and the outer Nesterov step.

Sign convention. Δ = local − global points *towards* the participants, so the outer step adds it:

    v ← μ·v + Δ̄
    θ ← θ + η·(Δ̄ + μ·v)      (Nesterov)      or      θ ← θ + η·v      (plain momentum)

With η = 1 and μ = 0 the new global is exactly the mean of the local models; a test pins this,
because subtracting Δ̄ instead (an ascent step) is an easy mistake that only shows up as slow
divergence.

Determinism. :func:`aggregate` sums in sorted participant-id order in fp64 and rounds once to
fp32, so the result is bitwise identical whatever order the replies arrived in.
:func:`aggregate_checked` runs it twice and compares SHA-256 digests of the bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping

import numpy as np
import torch

from lensemble.errors import ConfigError, NonDeterministicAggregation, RoundError
from lensemble.federation.pseudograd import StateDict

ParticipantId = Hashable


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """Hex SHA-256 over name, dtype, shape and little-endian bytes of each tensor, sorted by name."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        arr = t.numpy() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy()
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        h.update(name.encode("utf-8") + b"\0")
        h.update(str(t.dtype).encode() + b"\0")
        h.update(np.asarray(t.shape, dtype="<u8").tobytes())
        h.update(arr.tobytes())
    return h.hexdigest()


def _check_same_layout(reference: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor], what: str):
    if set(reference) != set(other):
        missing = sorted(set(reference) - set(other))
        extra = sorted(set(other) - set(reference))
        raise RoundError(f"{what}: keys differ (missing {missing[:5]}, extra {extra[:5]})")
    for name in reference:
        if tuple(reference[name].shape) != tuple(other[name].shape):
            # shape equality is checked explicitly: broadcasting would otherwise let a scalar
            # or a (1,)-tensor silently update a whole weight matrix
            raise RoundError(
                f"{what}: {name!r} has shape {tuple(other[name].shape)}, "
                f"expected {tuple(reference[name].shape)}"
            )


def outer_step_size(outer_lr: float, parties: int, kappa: float | None) -> float:
    """The outer learning rate η of a round averaging ``parties`` = C updates: ``outer_lr``, divided by
    the linearised overshoot 1 + κ(C − 1) when κ is given (``federation.response_kappa``). Each
    participant of the pooled objective moves its own share of the pool as if the others stood still,
    i.e. C times as far as the pooled gap at κ = 1; κ = 0 (updates that move only their own silo's
    latents) leaves η alone."""
    if kappa is None:
        return float(outer_lr)
    if not 0.0 <= kappa <= 1.0 or parties < 1:
        raise ConfigError(f"response κ must lie in [0, 1] and the parties be >= 1, got κ = {kappa}, C = {parties}")
    return float(outer_lr) / (1.0 + float(kappa) * (parties - 1))


def aggregate(deltas: Mapping[ParticipantId, Mapping[str, torch.Tensor]]) -> StateDict:
    """Mean pseudo-gradient Δ̄ = (1/C)·Σ_c Δ_c, fp32, bitwise independent of arrival order.

    ``deltas`` maps participant id → Δ (same keys and shapes for all). Ids must be mutually
    orderable (all str or all int). The sum runs in sorted-id order in fp64, then one division
    and one rounding to fp32.
    """
    if not deltas:
        raise RoundError("no pseudo-gradients to aggregate")
    order = sorted(deltas)
    first = deltas[order[0]]
    for pid in order[1:]:
        _check_same_layout(first, deltas[pid], f"participant {pid!r}")
    count = len(order)
    mean: StateDict = {}
    for name in sorted(first):
        acc = torch.zeros(first[name].shape, dtype=torch.float64)
        for pid in order:
            acc += deltas[pid][name].detach().to("cpu", torch.float64)
        mean[name] = (acc / count).to(torch.float32)
    return mean


def aggregate_checked(deltas: Mapping[ParticipantId, Mapping[str, torch.Tensor]]) -> StateDict:
    """:func:`aggregate`, run twice; raises :class:`NonDeterministicAggregation` if the bytes differ.

    Cheap insurance: a bitwise-reproducible mean is what lets a restarted coordinator replay a
    round and land on the same checkpoint hash.
    """
    first = aggregate(deltas)
    second = aggregate(deltas)
    a, b = state_digest(first), state_digest(second)
    if a != b:
        raise NonDeterministicAggregation(
            "two aggregations of the same pseudo-gradients differ", first=a, second=b
        )
    return first


class OuterOptimizer:
    """DiLoCo outer optimizer over a global state dict.

    ``params``: the global model (name → tensor). Floating entries are the parameters; they keep
    their dtype (the checkpointed fp32 master weights). Non-floating entries (integer buffers) are
    carried over unchanged: they have no pseudo-gradient (see :mod:`.pseudograd`), and a Δ that
    names one is rejected. The world model uses LayerNorm, so there are none in practice.

    ``lr`` η, ``momentum`` μ, ``nesterov``: see the module docstring. The velocity and the update
    arithmetic use ``dtype`` (fp64 by default), and the new parameters are rounded once to their
    own dtype.

    :meth:`preview` computes the next global without touching any state, so a round can write its
    checkpoint and ledger first and only then :meth:`commit` (which advances velocity and params).
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        dtype: torch.dtype = torch.float64,
    ):
        if not lr > 0:
            raise ConfigError(f"outer lr must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ConfigError(f"outer momentum must be in [0, 1), got {momentum}")
        if not dtype.is_floating_point:
            raise ConfigError(f"outer dtype must be floating, got {dtype}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.dtype = dtype
        self._params: StateDict = {k: v.detach().to("cpu").clone() for k, v in sorted(params.items())}
        self._float_keys = tuple(k for k in self._params if self._params[k].is_floating_point())
        self._velocity: StateDict = {
            k: torch.zeros(self._params[k].shape, dtype=dtype) for k in self._float_keys
        }
        self.steps = 0

    @property
    def params(self) -> StateDict:
        """A copy of the current global state dict (mutating it does not affect the optimizer)."""
        return {k: v.clone() for k, v in self._params.items()}

    @property
    def velocity(self) -> StateDict:
        """A copy of the momentum buffer v (``dtype``, one tensor per floating parameter)."""
        return {k: v.clone() for k, v in self._velocity.items()}

    def _step(self, mean_delta: Mapping[str, torch.Tensor]) -> tuple[StateDict, StateDict]:
        expected = {k: self._params[k] for k in self._float_keys}
        _check_same_layout(expected, mean_delta, "mean pseudo-gradient")
        mu, eta = self.momentum, self.lr
        new_params: StateDict = {}
        new_velocity: StateDict = {}
        for name in self._float_keys:
            d = mean_delta[name].detach().to("cpu", self.dtype)
            v = self._velocity[name] * mu + d
            direction = d + mu * v if self.nesterov else v
            theta = self._params[name]
            new_params[name] = (theta.to(self.dtype) + eta * direction).to(theta.dtype)
            new_velocity[name] = v
        for name, t in self._params.items():
            if name not in new_params:
                new_params[name] = t.clone()
        return dict(sorted(new_params.items())), new_velocity

    def preview(self, mean_delta: Mapping[str, torch.Tensor]) -> StateDict:
        """The global state dict the next :meth:`commit` with this Δ̄ would produce. Pure."""
        return self._step(mean_delta)[0]

    def commit(
        self, mean_delta: Mapping[str, torch.Tensor], *, expected: Mapping[str, torch.Tensor] | None = None
    ) -> StateDict:
        """Apply the outer step: advance v and θ; return a copy of the new global.

        ``expected`` (usually the earlier :meth:`preview`, already checkpointed): if given and the
        committed result differs bitwise, raise :class:`NonDeterministicAggregation` and leave the
        optimizer unchanged.
        """
        new_params, new_velocity = self._step(mean_delta)
        if expected is not None and state_digest(new_params) != state_digest(expected):
            raise NonDeterministicAggregation("committed global differs from the previewed one")
        self._params = new_params
        self._velocity = new_velocity
        self.steps += 1
        return self.params

    def state_dict(self) -> dict:
        """Velocity, step count and hyper-parameters (not θ: that lives in the checkpoint).

        ``velocity`` is stored in ``dtype`` so a reload continues bitwise identically.
        """
        return {
            "lr": self.lr,
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "dtype": str(self.dtype).removeprefix("torch."),
            "steps": self.steps,
            "velocity": {k: v.clone() for k, v in self._velocity.items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore velocity and step count saved by :meth:`state_dict`.

        The hyper-parameters must match this optimizer's (a silent change would break the
        bitwise-resume promise); a mismatch raises :class:`ConfigError`.
        """
        mine = {
            "lr": self.lr,
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "dtype": str(self.dtype).removeprefix("torch."),
        }
        for key, value in mine.items():
            if state.get(key) != value:
                raise ConfigError(
                    f"outer optimizer state has {key}={state.get(key)!r}, this run uses {value!r}",
                    remediation="Resume with the federation settings the run was started with.",
                )
        velocity = state["velocity"]
        expected = {k: self._velocity[k] for k in self._float_keys}
        _check_same_layout(expected, velocity, "saved velocity")
        self._velocity = {k: velocity[k].detach().to("cpu", self.dtype).clone() for k in self._float_keys}
        self.steps = int(state["steps"])


__all__ = ["state_digest", "aggregate", "aggregate_checked", "OuterOptimizer"]
