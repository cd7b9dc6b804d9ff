"""The framework-free engine: every participant runs in this process, one after another.

It asks the very same ``participant_round`` as the Flower ClientApp, through the same round
driver and coordinator as the Flower ServerApp, without Flower or Ray. That makes it the fastest
way to run a tiny federation (tests, CPU studies) and the reference the Flower engines are checked
against (same final checkpoint hash).

The round deadline holds here too, after the fact: participants run in turn, so a reply that
arrives after ``federation.round_timeout_s`` from the round's start is dropped as late, exactly as
a Flower Grid drops it. (A participant that never returns cannot be pre-empted in this process;
use a Flower engine when nodes may hang.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.errors import LensembleError, RoundError
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.messages import NodeSpec
from lensemble.federation.participant import participant_round
from lensemble.federation.rounds import Answers, AskFn, drive_rounds

# {(round, partition): "crash" | "timeout"}: injected faults for tests
Faults = dict[tuple[int, int], str]


def ask_in_process(cfg: LensembleConfig, nodes: list[NodeSpec], *,
                   participant: Callable = participant_round, faults: Faults | None = None) -> AskFn:
    """An AskFn that calls ``participant`` for every node in turn, in this process.

    ``faults`` injects failures: ``"crash"`` makes that participant raise, ``"timeout"`` makes its
    reply arrive after the deadline.
    """
    def ask(t, round_config, global_arrays, extras, deadline_s) -> Answers:
        answers = Answers(asked=len(nodes))
        start = time.monotonic()
        for node in nodes:
            fault = (faults or {}).get((t, node.partition_id))
            try:
                if fault == "crash":
                    raise RoundError(f"injected crash of {node.participant_id}")
                reply = participant(cfg, node, global_arrays, round_config, extras)
            except Exception as exc:  # a crashed participant costs the round its update...
                if isinstance(exc, LensembleError) and exc.fail_closed:
                    raise  # ...but a broken invariant (residency, privacy) stops the run
                answers.failures[node.participant_id] = f"{type(exc).__name__}: {exc}"
                continue
            late = time.monotonic() - start > deadline_s
            if late or fault == "timeout":
                answers.failures[node.participant_id] = f"no reply within the round deadline ({deadline_s:g} s)"
                continue
            answers.replies[node.participant_id] = reply
        return answers

    return ask


def run_inprocess(cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True,
                  fail: Faults | None = None, coordinator: Callable = Coordinator,
                  participant: Callable = participant_round) -> dict:
    """Run (or resume) all rounds in this process; return the coordinator's summary.

    ``fail`` injects faults (see :func:`ask_in_process`). ``coordinator`` and ``participant`` are
    the two sides of the round (tests pass fakes).
    """
    run_dir = Path(run_dir)
    coord = coordinator(cfg, run_dir, progress=progress)
    state_dir = str(cfg.federation.state_dir or run_dir / "nodes")
    nodes = [NodeSpec(i, None, state_dir) for i in range(cfg.data.num_silos)]
    ask = ask_in_process(cfg, nodes, participant=participant, faults=fail)
    return drive_rounds(coord, ask, cfg.federation, progress=progress)


__all__ = ["run_inprocess", "ask_in_process"]
