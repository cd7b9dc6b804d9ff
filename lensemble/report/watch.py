"""Progress of a running federation, read from its run folder (for the CLI's heartbeat line).

The round driver prints one line when a round closes. Between those lines the run folder already
says how far the round is: a participant that finished its inner steps has written
``nodes/<participant>/inner-after-<round>.pt``, and a committed round has
``rounds/round-XXXX/state/header.json``. :class:`RoundWatch` turns that into a line such as
``round 2/3 running for 41.0s, 1/2 participants done; ETA 1m10s for the remaining rounds``
(the ETA is the mean duration of the rounds finished in this process times the rounds left). It
reads files only, so it works the same for every engine whose nodes share this machine's disk.
"""

from __future__ import annotations

import time
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.observability.progress import format_duration


class RoundWatch:
    """``status()`` -> a progress line while rounds run, None before (data, warm start) and after."""

    def __init__(self, cfg: LensembleConfig, run_dir: str | Path, *, clock=time.time):
        self.run_dir = Path(run_dir)
        self.total = int(cfg.federation.rounds)
        self.participants = int(cfg.data.num_silos)
        self.state_dir = Path(cfg.federation.state_dir or self.run_dir / "nodes")
        self.external_warmstart = bool(cfg.federation.warmstart)
        self.clock = clock
        self._seen = self.committed()
        self._since = clock()  # when the running round started (wall clock, as file times)
        self._durations: list[float] = []

    def _headers(self) -> list[Path]:
        rounds = self.run_dir / "rounds"
        if not rounds.is_dir():
            return []
        return sorted(h for h in (p / "state" / "header.json" for p in rounds.glob("round-*")) if h.is_file())

    def committed(self) -> int:
        return len(self._headers())

    def _warm_ready(self) -> bool:
        return self.external_warmstart or (self.run_dir / "warmstart" / "result.json").is_file() or self._seen > 0

    def participants_done(self, t: int) -> int:
        if not self.state_dir.is_dir():
            return 0
        return sum(1 for p in self.state_dir.iterdir() if (p / f"inner-after-{t:05d}.pt").is_file())

    def status(self) -> str | None:
        now = self.clock()
        headers = self._headers()
        done = len(headers)
        result = self.run_dir / "warmstart" / "result.json"
        if self._seen == 0 and result.is_file():
            self._since = max(self._since, result.stat().st_mtime)  # round 1 starts after the warm start
        if done > self._seen:
            latest = headers[-1].stat().st_mtime
            self._durations.append(max(0.0, latest - self._since) / (done - self._seen))
            self._seen, self._since = done, latest
        if done >= self.total:
            return None
        if not self._warm_ready():
            self._since = now  # the first round starts once the warm start is there
            return None
        running = max(0.0, now - self._since)
        line = (f"round {done + 1}/{self.total} running for {format_duration(running)}, "
                f"{self.participants_done(done)}/{self.participants} participants done")
        if self._durations:
            mean = sum(self._durations) / len(self._durations)
            eta = max(0.0, mean * (self.total - done) - running)
            line += f"; ETA {format_duration(eta)} for the remaining rounds"
        return line


__all__ = ["RoundWatch"]
