"""The framework-free engine: every participant runs in this process, one after another.

It asks the very same ``participant_round`` as the Flower ClientApp, through the same round
driver and coordinator as the Flower ServerApp, without Flower or Ray. That makes it the fastest
way to run a tiny federation (tests, CPU studies) and the reference the Flower engines are checked
against (same final checkpoint hash).

The round deadline (``federation.round_timeout_s``, from the round's start) is enforced as on a
Flower Grid: each participant runs on a daemon worker thread and gets what is left of the
deadline; one that is still running when it passes costs the round its update, is not waited
for, and is not asked again until it has returned (its thread never keeps the process alive).
Participants still run in turn, so a slow one eats into the time of those after it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError, LensembleError, error_label
from lensemble.federation.checks import SECURE_ENGINES
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.faults import FaultPlan, check_plan, fault_for, faulty
from lensemble.federation.global_cache import holders
from lensemble.federation.messages import NodeSpec
from lensemble.federation.participant import participant_round
from lensemble.federation.rounds import Answers, AskFn, drive_rounds


class _Call:
    """One participant call on a daemon thread: ``result`` or ``error`` once ``done``."""

    def __init__(self, fn: Callable, args: tuple, t: int):
        self.round = t
        self.started = time.monotonic()
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name=f"lensemble-participant-r{t}")
        self._thread.start()

    def _run(self, fn, args) -> None:
        try:
            self.result = fn(*args)
        except BaseException as exc:  # handed to the engine's thread, which decides
            self.error = exc
        finally:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(0.0, timeout))

    @property
    def done(self) -> bool:
        return self._done.is_set()


def ask_in_process(cfg: LensembleConfig, nodes: list[NodeSpec], *,
                   participant: Callable = participant_round, late: FaultPlan | None = None) -> AskFn:
    """An AskFn that calls ``participant`` for every node in turn, each within the deadline.

    ``late`` ({(round, partition): "timeout"}) makes those replies count as arriving after the
    deadline (a test hook; see :mod:`lensemble.federation.faults` for the others). A participant
    still busy with an earlier round is not asked (its silo is reported "still busy").
    """
    busy: dict[str, _Call] = {}
    late = dict(late or {})

    def ask(t, round_config, global_arrays, extras, deadline_s) -> Answers:
        answers = Answers()
        kept = holders(round_config)
        start = time.monotonic()
        for node in nodes:
            pid = node.participant_id
            prev = busy.get(pid)
            if prev is not None and not prev.done:
                answers.failures[pid] = (f"is still busy with round {prev.round} (no reply for "
                                         f"{time.monotonic() - prev.started:.1f} s); not asked")
                continue
            busy.pop(pid, None)
            left = deadline_s - (time.monotonic() - start)
            if left <= 0:
                answers.failures[pid] = f"was not reached within the round deadline ({deadline_s:g} s)"
                continue
            answers.asked += 1
            # a participant that kept this round's global from its summary ask gets none, as on a grid
            arrays = {} if pid in kept else global_arrays
            call = _Call(participant, (cfg, node, arrays, round_config, extras), t)
            if not call.wait(left):
                busy[pid] = call  # abandoned, as a Grid abandons a late node; never asked twice
                answers.failures[pid] = f"did not reply within {deadline_s:g} s"
                continue
            exc = call.error
            if exc is not None:
                if not isinstance(exc, Exception) or (isinstance(exc, LensembleError) and exc.fail_closed):
                    raise exc  # a broken invariant (residency, privacy) or an interrupt stops the run
                # ...any other error costs the round this update; only its class crosses over
                answers.failures[pid] = f"failed: {error_label(exc)}"
                continue
            if fault_for(late, t, node.partition_id) == "timeout":
                answers.failures[pid] = f"did not reply within {deadline_s:g} s"
                continue
            answers.replies[pid] = call.result
        return answers

    return ask


def run_inprocess(cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True,
                  fail: FaultPlan | None = None, coordinator: Callable = Coordinator,
                  participant: Callable = participant_round) -> dict:
    """Run (or resume) all rounds in this process; return the coordinator's summary.

    ``fail`` injects faults: ``{(round, partition): fault}`` with the faults of
    :mod:`lensemble.federation.faults` plus ``"timeout"`` (the reply counts as late).
    ``coordinator`` and ``participant`` are the two sides of the round (tests pass fakes).
    """
    if cfg.federation.secure_aggregation:
        # SecAgg+ is a protocol between nodes: this engine has no grid to run its four stages on
        raise ConfigError("federation.secure_aggregation needs a Flower engine: the in-process engine "
                          "calls participants directly and cannot run SecAgg+",
                          remediation="use --engine " + " or --engine ".join(SECURE_ENGINES)
                                      + ", or a SuperLink deployment (docs/deployment.md)")
    run_dir = Path(run_dir)
    plan = check_plan(fail or {}, extra=("timeout",))
    late = {k: v for k, v in plan.items() if v == "timeout"}
    faults = {k: v for k, v in plan.items() if v != "timeout"}
    if faults:
        participant = faulty(participant, faults)
    coord = coordinator(cfg, run_dir, progress=progress)
    state_dir = str(cfg.federation.state_dir or run_dir / "nodes")
    nodes = [NodeSpec(i, None, state_dir) for i in range(cfg.data.num_silos)]
    ask = ask_in_process(cfg, nodes, participant=participant, late=late)
    return drive_rounds(coord, ask, cfg.federation, progress=progress)


__all__ = ["run_inprocess", "ask_in_process"]
