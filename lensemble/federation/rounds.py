"""The one DiLoCo round driver: attempts, retries, the deadline, fail-closed errors, progress.

Every engine runs a federation through :func:`drive_rounds`. An engine supplies only *how to ask
the participants* — an :data:`AskFn` that sends round ``t``'s instruction to every participant it
can reach and returns whatever came back before the deadline:

- the framework-free engine (:mod:`lensemble.federation.inprocess`) calls the participants one
  after another in this process;
- the Flower ServerApp (:mod:`lensemble.federation.flower.server_app`) sends messages over a
  Flower Grid (in-process grid, Ray simulation, or a real SuperLink).

For each round from ``coordinator.next_round``: build the round config and the global arrays,
ask, then ``coordinator.close_round``. A FaultToleranceExceeded (too few nodes online, quorum not
met) costs one attempt: the round is retried ``federation.round_retries`` more times with the
global unchanged, then the error propagates. Any other exception (a fail-closed error such as
ResidencyViolation or PrivacyBudgetExceeded, a broken invariant) propagates at once.

The coordinator is duck-typed: ``num_rounds``, ``next_round``, ``round_config(t)``,
``global_arrays()``, optional ``extras`` (public side inputs, e.g. anchor targets), optional
``before_ask(t)`` (called just before every ask: the DP tally counts asks durably), optional
``pools`` with ``summary_config(t)``, ``close_summaries(t, replies, failures, wire_bytes=[,
secure_sum=])`` (and, when ``moments_first``, ``moments_config(t)`` and ``close_moments(...)``;
when ``gradient_pass``, ``gradient_config(t)`` and ``close_gradients(...)``: the other summary
passes, :func:`_summary_passes`) and optional ``global_cache_config(t)`` (the pooled objective's summary ask before
the train ask, :mod:`lensemble.federation.pooling`; the train ask's round config then names the
global by its digest for the participants that kept it, :mod:`lensemble.federation.global_cache`,
and an ask sends those an empty global), ``close_round(t, replies, failures, wire_bytes=,
seconds=[, secure_sum=])`` and ``finish()``; tests drive fakes. ``secure_sum`` is passed only
when the ask ran secure aggregation.

Failures are phrases that read after the participant id ("did not reply within 5 s",
"failed: RoundError [round_failed]"), so the round line and the quorum error say what happened.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lensemble.config.schema import FederationConfig
from lensemble.errors import FaultToleranceExceeded
from lensemble.federation.validation import describe_failures, retry_or_raise


@dataclass
class Answers:
    """What came back for one attempt at a round.

    replies: participant id -> Reply; failures: participant id (or ``node-<id>`` while a node's
    silo is unknown) -> reason; asked: participants (or nodes) the instruction went to;
    wire_bytes: serialised array bytes sent and received, or None when nothing was serialised
    (the coordinator then counts the replies' payload bytes); secure_sum: under secure
    aggregation, the unmasked sum of the updates
    (:class:`~lensemble.federation.secure_agg.SecureSum`) — the replies then carry no update.
    """

    replies: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    asked: int = 0
    wire_bytes: int | None = None
    secure_sum: Any = None


# ask(t, round_config, global_arrays, extras, deadline_s) -> Answers
AskFn = Callable[[int, dict, dict[str, np.ndarray], dict[str, np.ndarray], float], Answers]


def drive_rounds(coordinator: Any, ask: AskFn, federation: FederationConfig, *, progress: bool = True) -> dict:
    """Run the coordinator's remaining rounds through ``ask``; return ``coordinator.finish()``."""
    total = int(coordinator.num_rounds)
    say = _printer(progress)
    say(f"coordinator: rounds {int(coordinator.next_round) + 1}..{total} of {total}, "
        f"quorum {federation.min_participants}, round deadline {federation.round_timeout_s:g} s")
    for t in range(int(coordinator.next_round), total):
        attempt = 1
        while True:
            started = time.monotonic()
            try:
                round_config = coordinator.round_config(t)
                if hasattr(coordinator, "before_ask"):
                    coordinator.before_ask(t)  # e.g. the DP tally counts the ask before it goes out
                extras = dict(getattr(coordinator, "extras", None) or {})
                if getattr(coordinator, "pools", False):
                    # the pooled objective: the participants' summaries of this round's global
                    # model first; the train ask carries their mean (federation/pooling.py)
                    pooled, cached = _summary_passes(coordinator, ask, t, federation.round_timeout_s)
                    extras |= pooled
                    # those whose summary was accepted kept this global: the train ask sends
                    # them its digest instead (federation/global_cache.py)
                    round_config = {**round_config, **cached}
                answers = ask(t, round_config, coordinator.global_arrays(), extras, federation.round_timeout_s)
                seconds = time.monotonic() - started
                # only a secure ask passes the sum: a coordinator without secure aggregation
                # keeps its signature
                metrics = coordinator.close_round(t, answers.replies, answers.failures,
                                                  wire_bytes=answers.wire_bytes, seconds=seconds,
                                                  **_secure(answers)) or {}
                break
            except FaultToleranceExceeded as err:
                say(f"round {t + 1}/{total} attempt {attempt} failed: {err.message}")
                retry_or_raise(err, attempt, federation.round_retries)  # re-raises when spent
                attempt += 1
        say(_round_line(t, total, attempt, answers, metrics, seconds, federation.min_participants))
    summary = coordinator.finish()
    say(f"federation finished: {total} rounds")
    return summary


def _secure(answers: Answers) -> dict:
    """``{"secure_sum": ...}`` when the ask ran secure aggregation, else nothing: a coordinator
    without secure aggregation keeps its signature."""
    return {"secure_sum": answers.secure_sum} if answers.secure_sum is not None else {}


def _summary_passes(coordinator: Any, ask: AskFn, t: int, deadline_s: float) -> tuple[dict, dict]:
    """Round t's summary passes (federation/pooling.py, PHASES): the BatchNorm moments when
    ``coordinator.moments_first`` (SIGReg and BatchNorm pooled: every ECF summary is encoded under
    the round's pooled moments), the summaries, then the moment gradients when
    ``coordinator.gradient_pass``, each asked with the previous pass's pooled result. Returns (the
    train ask's extras, its global-cache round config)."""
    def cached() -> dict:  # who kept this round's global, named in the next ask
        return coordinator.global_cache_config(t) if hasattr(coordinator, "global_cache_config") else {}

    summary_config, first = coordinator.summary_config(t), {}
    if getattr(coordinator, "moments_first", False):
        moments = ask(t, coordinator.moments_config(t), coordinator.global_arrays(), {}, deadline_s)
        first = coordinator.close_moments(t, moments.replies, moments.failures, wire_bytes=moments.wire_bytes,
                                          **_secure(moments))
        summary_config = {**summary_config, **cached()}
    summaries = ask(t, summary_config, coordinator.global_arrays(), first, deadline_s)
    pooled = coordinator.close_summaries(t, summaries.replies, summaries.failures, wire_bytes=summaries.wire_bytes,
                                         **_secure(summaries))
    kept = cached()
    if getattr(coordinator, "gradient_pass", False):
        grads = ask(t, {**coordinator.gradient_config(t), **kept}, coordinator.global_arrays(), pooled, deadline_s)
        pooled |= coordinator.close_gradients(t, grads.replies, grads.failures, wire_bytes=grads.wire_bytes,
                                              **_secure(grads))
    return pooled, kept


def _printer(enabled: bool) -> Callable[[str], None]:
    # One plain line per event on stderr: readable in a terminal and in a log file alike.
    if not enabled:
        return lambda _line: None
    return lambda line: print(f"[lensemble] {line}", file=sys.stderr, flush=True)


def _human_bytes(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"


def _round_line(t: int, total: int, attempt: int, answers: Answers, metrics: dict, seconds: float,
                quorum: int) -> str:
    wire = answers.wire_bytes if answers.wire_bytes is not None else metrics.get("fed/comm_bytes", 0)
    retry = f" (attempt {attempt})" if attempt > 1 else ""
    # replies the coordinator refused (unusable, above the norm bound) did not carry the round
    refused = {p: why for p, why in (metrics.get("dropped") or {}).items() if p in answers.replies}
    accepted = sorted(p for p in answers.replies if p not in refused)
    line = (f"round {t + 1}/{total}{retry}: {len(answers.replies)}/{answers.asked} replies"
            f"{f', {len(accepted)} accepted' if refused else ''}, "
            f"{_human_bytes(float(wire))} on the wire, {seconds:.1f} s")
    if answers.secure_sum is not None:
        line += f", SecAgg+ sum of {answers.secure_sum.participants}"
    # drift in the measure that means something: the angle within the global's 95 %-energy subspace
    # (the full-space geodesic angle counts directions the embeddings barely use; report tables)
    if metrics.get("gauge/drift_subspace_angle_deg") is not None:
        line += f", drift {metrics['gauge/drift_subspace_angle_deg']:.1f}° (95 %-energy subspace)"
    if "loss/pred" in metrics:
        line += f", pred loss {metrics['loss/pred']:.3f}"
    if answers.failures or refused:
        # Say what happened, then who carried the round: "silo-1 did not reply within 5 s;
        # quorum 1 met by silo-0".
        line += f"\n[lensemble]   {describe_failures({**answers.failures, **refused})}; quorum {quorum} met by " + \
            ", ".join(accepted)
    return line


__all__ = ["Answers", "AskFn", "drive_rounds"]
