"""A framework-free federation engine: every participant runs in this process, in turn.

It drives exactly the same ``participant_round`` and ``Coordinator`` as the Flower apps, without
Flower or Ray, which makes it the fastest way to run a tiny federation (tests, CPU studies) and
the reference the Flower engines are checked against.
"""

from __future__ import annotations

import time
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.errors import FaultToleranceExceeded, LensembleError, RoundError
from lensemble.federation.roles import Coordinator, NodeSpec, participant_round
from lensemble.federation.validation import retry_or_raise
from lensemble.observability.progress import progress_bar


def run_inprocess(cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True,
                  fail: dict[tuple[int, int], str] | None = None) -> dict:
    """Run (or resume) all rounds in this process; return the coordinator's summary.

    ``fail`` injects faults for tests: {(round, partition): "crash"} makes that participant raise,
    {(round, partition): "timeout"} makes it miss the round's deadline (its reply is dropped).
    """
    run_dir = Path(run_dir)
    coord = Coordinator(cfg, run_dir, progress=progress)
    state_dir = Path(cfg.federation.state_dir or run_dir / "nodes")
    nodes = [NodeSpec(i, None, str(state_dir)) for i in range(cfg.data.num_silos)]
    with progress_bar("federated rounds", coord.num_rounds, enabled=progress) as advance:
        advance(coord.next_round)
        while not coord.done:
            t = coord.next_round
            attempt = 0
            while True:
                attempt += 1
                started = time.perf_counter()
                rcfg = coord.round_config(t)
                replies, failures = {}, {}
                for node in nodes:
                    try:
                        fault = (fail or {}).get((t, node.partition_id))
                        if fault == "crash":
                            raise RoundError(f"injected crash of {node.participant_id}")
                        reply = participant_round(cfg, node, coord.global_arrays(), rcfg, coord.extras)
                        if fault == "timeout":
                            raise TimeoutError(f"{node.participant_id} missed the round deadline")
                        replies[node.participant_id] = reply
                    except Exception as exc:  # a crashed participant costs the round its update...
                        if isinstance(exc, LensembleError) and exc.fail_closed:
                            raise  # ...but a broken invariant (residency, privacy) stops the run
                        failures[node.participant_id] = f"{type(exc).__name__}: {exc}"
                try:
                    m = coord.close_round(t, replies, failures, seconds=time.perf_counter() - started)
                    break
                except FaultToleranceExceeded as exc:
                    retry_or_raise(exc, attempt, cfg.federation.round_retries)
            advance(1, info=f"drift {m.get('gauge/drift_angle_deg', float('nan')):.1f}° pred {m.get('loss/pred', float('nan')):.3f}")
    return coord.finish()
