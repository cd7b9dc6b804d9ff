"""Progress is readable in a log file: plain throttled lines with an ETA when stderr is not a
terminal; a quiet console by default; the federation heartbeat reads the run folder."""

import io
import json
import logging
import os
import time
import warnings

import pytest

from lensemble.observability import progress
from lensemble.observability.console import QuietFilter, configure_console
from lensemble.observability.progress import (
    Heartbeat,
    PlainProgress,
    eta_seconds,
    format_duration,
    interactive,
    progress_bar,
    progress_line,
)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_format_duration_and_line():
    assert format_duration(7.34) == "7.3s" and format_duration(130) == "2m10s" and format_duration(3725) == "1h02m05s"
    assert progress_line("warm start", 450, 1500, 130.0) == "warm start 450/1500 (30 %), 2m10s elapsed, ETA 5m03s"
    assert progress_line("x", 3, 3, 1.0, "pred 0.1", finished=True) == "x 3/3 (100 %), 1.0s elapsed, done · pred 0.1"


def test_plain_progress_prints_every_tenth_and_every_30_seconds():
    clock = Clock()

    class Log(io.StringIO):
        def __init__(self):
            super().__init__()
            self.times = []

        def write(self, text):
            if text.strip():
                self.times.append(clock.t)
            return super().write(text)

    out = Log()
    bar = PlainProgress("warm start", 1000, stream=out, clock=clock)
    for i in range(1000):
        clock.t += 0.01 if i < 500 else 0.5  # the second half is slow: the 30 s rule fires too
        bar.advance(1, info=f"step {i}")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[lensemble] warm start 0/1000, started"
    assert lines[-1].startswith("[lensemble] warm start 1000/1000 (100 %)") and ", done" in lines[-1]
    assert all(line.startswith("[lensemble] warm start ") for line in lines)
    assert all("ETA" in line for line in lines[1:-1])
    fast = [line for line, t in zip(lines, out.times, strict=True) if 0 < t <= 5.0]
    assert [line.split(" (")[1].split(")")[0] for line in fast] == ["10 %", "20 %", "30 %", "40 %", "50 %"]
    gaps = [b - a for a, b in zip(out.times, out.times[1:], strict=False)]
    assert max(gaps) <= 30.0 + 1e-9  # a slow step never leaves the log silent for more than 30 s
    assert len(lines) < 30


def test_a_resumed_count_is_shown_but_left_out_of_the_eta():
    """A study resumed with 98 of 177 runs done that then takes 10 min per run: the ETA must be
    for the 79 left at that rate, not the few minutes that counting the 98 as instant would say."""
    assert eta_seconds(99, 177, 600.0, initial=98) == 78 * 600.0
    assert eta_seconds(98, 177, 600.0, initial=98) is None     # nothing new done yet: no rate
    assert eta_seconds(99, 177, 600.0) == pytest.approx(600.0 * 78 / 99)  # what the old bar said

    class Clock:
        t = 0.0

    clock, out = Clock(), io.StringIO()
    bar = PlainProgress("study region", 177, stream=out, clock=lambda: clock.t, initial=98)
    clock.t = 600.0
    bar.advance(1)  # 99/177: 0.6 % past the last line, but 600 s > the 30 s rule
    lines = out.getvalue().splitlines()
    assert lines[0] == "[lensemble] study region 98/177, started (98 already done)"
    assert lines[-1].startswith("[lensemble] study region 99/177 (56 %), 10m00s elapsed, ETA 13h00m00s")


def test_progress_bar_is_plain_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.delenv("LENSEMBLE_PROGRESS", raising=False)
    assert not interactive(io.StringIO())
    with progress_bar("evaluate mpc heldout", 4) as advance:
        for _ in range(4):
            advance(1)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[lensemble] evaluate mpc heldout 0/4, started"
    assert err[-1].startswith("[lensemble] evaluate mpc heldout 4/4 (100 %)")
    with progress_bar("silent", 3, enabled=False) as advance:
        advance(3)
    assert capsys.readouterr().err == ""


def test_progress_env_override(monkeypatch):
    monkeypatch.setenv("LENSEMBLE_PROGRESS", "bar")
    assert interactive(io.StringIO())
    monkeypatch.setenv("LENSEMBLE_PROGRESS", "plain")
    assert not interactive()


def test_description_can_change_midway():
    out = io.StringIO()
    bar = PlainProgress("collecting", 2, stream=out)
    bar.advance(0, description="collecting silo 1 train")
    bar.advance(2)
    assert "collecting silo 1 train 2/2" in out.getvalue()


def test_heartbeat_prints_and_survives_errors():
    out = io.StringIO()
    calls = []

    def status():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a broken status must not stop the heartbeat")
        return "round 1/3 running" if len(calls) == 2 else None

    with Heartbeat(status, every=0.01, stream=out):
        deadline = time.monotonic() + 5
        while len(calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert out.getvalue().splitlines()[0] == "[lensemble] round 1/3 running"


def test_round_watch_reads_the_run_folder(tmp_path, micro_cfg):
    from lensemble.report.watch import RoundWatch

    now = [1000.0]
    cfg = micro_cfg.model_copy(update={"federation": micro_cfg.federation.model_copy(update={"rounds": 3})})
    watch = RoundWatch(cfg, tmp_path, clock=lambda: now[0])
    assert watch.status() is None  # no warm start yet: its own progress bar speaks
    (tmp_path / "warmstart").mkdir()
    (tmp_path / "warmstart" / "result.json").write_text("{}")
    os.utime(tmp_path / "warmstart" / "result.json", (1010.0, 1010.0))
    now[0] = 1040.0
    assert watch.status() == "round 1/3 running for 30.0s, 0/2 participants done"
    (tmp_path / "nodes" / "silo-0").mkdir(parents=True)
    (tmp_path / "nodes" / "silo-0" / "inner-after-00000.pt").write_bytes(b"")
    (tmp_path / "nodes" / "owner.lock").write_text("")  # other files in the state folder are ignored
    assert watch.status().endswith("1/2 participants done")
    header = tmp_path / "rounds" / "round-0000" / "state" / "header.json"
    header.parent.mkdir(parents=True)
    header.write_text(json.dumps({}))
    os.utime(header, (1070.0, 1070.0))  # round 1 took 60 s
    now[0] = 1100.0
    assert watch.status() == ("round 2/3 running for 30.0s, 0/2 participants done; "
                              "ETA 1m30s for the remaining rounds")


def test_quiet_filter():
    f = QuietFilter()

    def rec(level, msg):
        return logging.LogRecord("flwr", level, __file__, 1, msg, None, None)

    assert not f.filter(rec(logging.DEBUG, "Registered 2 nodes"))
    assert not f.filter(rec(logging.WARNING, "DEPRECATED FEATURE: %s\n\n  This is a deprecated feature."))
    assert f.filter(rec(logging.WARNING, "Node 3 did not reply"))
    assert f.filter(rec(logging.ERROR, "ClientApp raised an exception"))


def test_configure_console_quiet_then_verbose(monkeypatch):
    monkeypatch.delenv("FLWR_LOG_LEVEL", raising=False)
    flwr = logging.getLogger("flwr")
    saved = (flwr.level, flwr.propagate, list(flwr.filters), logging.getLogger("ray").level)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    flwr.addHandler(handler)
    flwr.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings():
            configure_console(False)
            configure_console(False)  # idempotent: one filter
            assert sum(isinstance(x, QuietFilter) for x in flwr.filters) == 1
            flwr.debug("Registered 2 nodes")
            flwr.warning("DEPRECATED FEATURE: %s", "run_simulation")
            flwr.warning("a real warning")
            assert stream.getvalue() == "a real warning\n" and flwr.propagate is False
            assert logging.getLogger("ray").level == logging.ERROR
            assert "FLWR_LOG_LEVEL" not in os.environ  # Flower's own processes keep their log files whole
            configure_console(True)
            assert os.environ["FLWR_LOG_LEVEL"] == "DEBUG"
            flwr.debug("Registered 2 nodes")
            assert stream.getvalue().endswith("Registered 2 nodes\n")
    finally:
        os.environ.pop("FLWR_LOG_LEVEL", None)
        flwr.removeHandler(handler)
        flwr.setLevel(saved[0])
        flwr.propagate = saved[1]
        flwr.filters[:] = saved[2]
        logging.getLogger("ray").setLevel(saved[3])


@pytest.fixture(autouse=True)
def _no_forced_progress(monkeypatch):
    monkeypatch.delenv("LENSEMBLE_PROGRESS", raising=False)
    yield
    assert progress.PREFIX == "[lensemble]"
