"""A stand-in coordinator and participant for testing the Flower adapters without the learning stack.

The ServerApp / ClientApp factories take them as objects (``make_server_app(Coordinator)``,
``make_client_app(participant_round)``); they follow the contract of docs/CONTRACTS.md
("Federation sides") with a two-tensor "model":
``a`` float32 (3,) and ``b`` float32 (2, 2), both zero at the start. Participant ``p`` (labelled
``silo-p`` like the real NodeSpec) always returns the pseudo-gradient ``0.1 * (p + 1)`` in every
coordinate (codec form ``{"fp32": ...}``), a (4, 2) probe embedding and a few metrics, one of which
(``extras_sum``) proves the coordinator's public ``extras`` arrived. The coordinator checks the quorum, averages with
outer learning rate 1 and no momentum, and writes what it saw to the run folder:

- ``rounds.jsonl``: one line per closed round (participants, failures, wire bytes, seconds),
- ``attempts.jsonl``: one line per close_round call, failed quorum attempts included,
- ``state.json``: next round and global arrays (so a restarted coordinator resumes),
- ``summary.json``: written by finish().

Misbehaviour for tests is declared in ``<run_dir>/behaviour.json`` and reaches participants in the
round config (so it works with in-process, Ray and real SuperNodes alike), e.g.
``{"raise": {"1": [0]}, "sleep": {"1": {"0": 3.0}}, "leak": {"1": [0]}}``:
partition 1 raises in round 0 / sleeps 3 s in round 0 / returns a reply with an extra field.
A round listed under ``"raise"`` as ``"*"`` raises in every round.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lensemble.errors import FaultToleranceExceeded
from lensemble.federation.messages import NodeSpec, Reply

SHAPES = {"a": (3,), "b": (2, 2)}
NUMEL = sum(int(np.prod(s)) for s in SHAPES.values())


@dataclass
class LeakyReply(Reply):
    raw_observations: np.ndarray = None  # must never leave a silo


def _flatten(arrays: dict) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], dtype=np.float32).reshape(-1) for k in sorted(arrays)])


def _unflatten(flat: np.ndarray) -> dict:
    out, i = {}, 0
    for k in sorted(SHAPES):
        n = int(np.prod(SHAPES[k]))
        out[k] = flat[i:i + n].reshape(SHAPES[k]).astype(np.float32)
        i += n
    return out


def _hit(table: dict, pid: int, t: int) -> bool:
    rounds = table.get(str(pid), [])
    return rounds == "*" or t in rounds


def participant_round(cfg, node: NodeSpec, global_arrays: dict, round_config: dict,
                      extras: dict | None = None) -> Reply:
    t = int(round_config["round"])
    behaviour = json.loads(round_config.get("behaviour", "{}"))
    pid = node.partition_id
    assert set(global_arrays) == set(SHAPES), global_arrays.keys()
    if _hit(behaviour.get("raise", {}), pid, t):
        raise RuntimeError(f"participant {pid} fails on purpose in round {t}")
    delay = behaviour.get("sleep", {}).get(str(pid), {}).get(str(t))
    if delay:
        time.sleep(float(delay))
    # inner state persists on local disk across rounds, one folder per participant
    folder = Path(node.state_dir) / node.participant_id
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / "rounds_seen.txt"
    seen = int(state.read_text()) if state.exists() else 0
    state.write_text(str(seen + 1))
    fields = dict(
        round_index=t,
        payload={"fp32": np.full(NUMEL, 0.1 * (pid + 1), dtype=np.float32)},
        probe_embeddings=np.full((4, 2), float(pid), dtype=np.float32),
        metrics={"train/loss": 1.0 / (t + 1), "inner/steps": 3, "rounds_seen": seen + 1,
                 "ok": True, "note": "strings stay home",
                 "extras_sum": float(sum(np.sum(v) for v in (extras or {}).values()))},
    )
    if _hit(behaviour.get("leak", {}), pid, t):
        return LeakyReply(**fields, raw_observations=np.zeros((2, 8, 8, 3), dtype=np.uint8))
    return Reply(**fields)


class Coordinator:
    extras = {"anchor-targets": np.ones((3, 2), dtype=np.float32), "anchor-idx": np.arange(3)}

    def __init__(self, cfg, run_dir: Path, *, progress: bool = True):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.num_rounds = cfg.federation.rounds
        state = self.run_dir / "state.json"
        if state.exists():
            saved = json.loads(state.read_text())
            self.next_round = saved["next_round"]
            self._global = {k: np.asarray(v, dtype=np.float32) for k, v in saved["global"].items()}
        else:
            self.next_round = 0
            self._global = {k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}
        path = self.run_dir / "behaviour.json"
        self.behaviour = path.read_text() if path.exists() else "{}"

    def global_arrays(self) -> dict:
        return {k: self._global[k].copy() for k in sorted(self._global)}

    def round_config(self, t: int) -> dict:
        return {"round": t, "config-json": self.cfg.model_dump_json(), "behaviour": self.behaviour,
                "inner-steps": self.cfg.federation.inner_steps}

    def _log(self, name: str, record: dict) -> None:
        with open(self.run_dir / name, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def close_round(self, t, replies, failures, wire_bytes, seconds) -> dict:
        assert t == self.next_round
        valid = {k: r for k, r in replies.items() if r.round_index == t}
        record = {"round": t, "participants": sorted(valid), "failures": failures,
                  "wire_bytes": wire_bytes, "seconds": seconds,
                  "metrics": {k: r.metrics for k, r in sorted(valid.items())},
                  "probe_shapes": {k: list(r.probe_embeddings.shape) for k, r in sorted(valid.items())}}
        self._log("attempts.jsonl", record)
        if len(valid) < self.cfg.federation.min_participants:
            raise FaultToleranceExceeded(f"round {t}: {len(valid)} valid update(s), quorum is "
                                         f"{self.cfg.federation.min_participants}")
        mean = np.mean([r.payload["fp32"].astype(np.float64) for _, r in sorted(valid.items())], axis=0)
        new = _flatten(self._global).astype(np.float64) + mean
        self._global = _unflatten(new.astype(np.float32))
        self.next_round = t + 1
        self._log("rounds.jsonl", record)
        (self.run_dir / "state.json").write_text(json.dumps(
            {"next_round": self.next_round, "global": {k: v.tolist() for k, v in self._global.items()}}))
        return {"fed/participants": len(valid), "fed/comm_bytes": wire_bytes}

    def finish(self) -> dict:
        summary = {"rounds": self.next_round, "global": {k: v.tolist() for k, v in self._global.items()}}
        (self.run_dir / "summary.json").write_text(json.dumps(summary))
        return summary
