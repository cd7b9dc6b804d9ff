"""Replay rounds of a finished federated run and re-measure their frame drift.

The participants' probe embeddings of a round are not kept, but a round is deterministic:
``participant_round`` started from the previous round's global model and the participant's inner
optimizer state after the previous round reproduces it. :func:`replay_rounds` re-runs chosen
rounds on a copy of the run folder, exactly as the in-process engine ran them (the real
:class:`~lensemble.federation.coordinator.Coordinator`, resumed on the copy at round t, supplies
the probe, its measurement split, the anchor extras and ``round_config(t)``; the participants are
asked through :func:`~lensemble.federation.inprocess.ask_in_process`), then measures the drift
of the replayed participants from the committed global ``rounds/round-t/model`` with
:func:`~lensemble.gauge.drift.frame_drift` as ``Coordinator._drift`` calls it, with
``degenerate="mask"`` (a pair whose full-rotation problem is degenerate still gets its
variance-weighted measures).

Each replayed round is verified against what the run kept:

- ``state_bitwise_equal``: the replayed inner-optimizer state after round t against the saved
  ``nodes/silo-K/inner-after-t.pt`` (every tensor ``torch.equal``); None where the run no longer
  keeps that round (it keeps the last two);
- ``global_hash_equal``: the replayed replies closed by the resumed coordinator give a model
  whose content hash is that of the saved ``rounds/round-t/model`` (None under secure
  aggregation, whose sums the in-process engine cannot form);
- ``recorded_max_abs_diff`` / ``recorded_max_rel_diff``: every replayed drift metric against the
  value the run recorded in ``summary.json`` for round t, wherever that value is not None.

The run folder is only read. Privacy-enabled runs are refused (their participants release no
probe embeddings, so there is no participant drift to re-measure), as are rounds that dropped a
participant.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config.schema import LensembleConfig
from lensemble.data.collect import _cached_summary, _collection_key
from lensemble.data.store import data_dir
from lensemble.errors import (
    ArtifactError,
    CheckpointIntegrityError,
    ConfigError,
    RoundError,
)
from lensemble.federation.coordinator import Coordinator, _own_warmstart
from lensemble.federation.inprocess import ask_in_process
from lensemble.federation.messages import NodeSpec, participant_id
from lensemble.federation.participant import OWNER_FILE, participant_round
from lensemble.federation.state import to_arrays
from lensemble.gauge.drift import GLOBAL_KEY
from lensemble.model.encoder import embed_frames
from lensemble.model.world_model import architecture, world_model_from_state

__all__ = ["replay_rounds", "state_file", "states_equal"]

#: What of a run folder a replay reads (copied into the work folder; the rest is never touched).
_COPIED = ("manifest.json", "run-id", "summary.json", "rounds", "nodes", "warmstart")


def state_file(state_dir: Path, t: int) -> Path:
    """A participant's inner-optimizer state after round ``t`` in its state folder (as
    ``participant_round`` names it)."""
    return Path(state_dir) / f"inner-after-{t:05d}.pt"


def states_equal(a, b, path: str = "") -> list[str]:
    """Where two inner-optimizer states (nested dicts / lists of tensors and scalars) differ.

    Tensors must have the same dtype and shape and be ``torch.equal`` (bitwise for finite
    values); everything else must be ``==``. Returns the differing paths (empty: identical).
    """
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in sorted(a, key=str) for d in states_equal(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in states_equal(x, y, f"{path}/{i}")]
    if torch.is_tensor(a) and torch.is_tensor(b):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [path]
    return [] if type(a) is type(b) and a == b else [path]


def _arrays_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """Names whose arrays differ in dtype, shape or bytes (or exist on one side only)."""
    if set(a) != set(b):
        return sorted(set(a) ^ set(b))
    return [k for k in sorted(a) if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
            or np.ascontiguousarray(a[k]).tobytes() != np.ascontiguousarray(b[k]).tobytes()]


def _say(progress: bool, line: str) -> None:
    if progress:
        print(f"[replay] {line}", file=sys.stderr, flush=True)


@contextmanager
def _data_root(cfg: LensembleConfig, data_root: str | os.PathLike | None, scratch: Path) -> Iterator[Path | None]:
    """Make ``cfg.data.root`` resolve to ``data_root`` without changing the config (its hash pins it).

    A relative ``data.root`` (``"data"``) is relative to the folder the run ran in. With
    ``data_root`` given, the block runs in ``scratch/cwd``, where ``<data.root>`` is a link to
    ``data_root``; it yields the absolute collection folder (what the in-process engine's
    participants resolve ``data_path=None`` to), or None without an override.
    """
    if data_root is None:
        yield None
        return
    target = Path(data_root).resolve()
    root = Path(cfg.data.root)
    if root.is_absolute():
        if root.resolve() != target:
            raise ConfigError(f"the run's data.root is the absolute {root}, not {target}: it cannot be "
                              "redirected without changing the config hash",
                              remediation="pass no data_root (or that folder)")
        yield data_dir(cfg).resolve()
        return
    if cfg.federation.warmstart and not Path(cfg.federation.warmstart).is_absolute():
        raise ConfigError(f"federation.warmstart {cfg.federation.warmstart!r} is relative to the folder the "
                          "run ran in, which a data_root override does not recreate",
                          remediation="replay from the folder the run ran in, without data_root")
    base = scratch / "cwd"
    link = base / root
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(target, target_is_directory=True)
    before = os.getcwd()
    os.chdir(base)
    try:
        yield (base / data_dir(cfg)).resolve()
    finally:
        os.chdir(before)


def _check_collection(cfg: LensembleConfig, probe_hash: str) -> None:
    """Refuse unless the run's collection is there, complete and holds its probe (the coordinator
    would otherwise collect one: a replay never writes into the data folder)."""
    folder = data_dir(cfg)
    summary = _cached_summary(folder, _collection_key(cfg))
    if summary is None:
        raise ConfigError(f"no complete collection of this run at {folder.resolve()}",
                          remediation="pass data_root = the data folder of the directory the run ran in")
    if summary["probe"]["content_hash"] != probe_hash:
        raise ConfigError(f"{folder.resolve()} holds probe {summary['probe']['content_hash'][:16]}…, "
                          f"the run was measured on {probe_hash[:16]}…")


def _coordinator_view(run: Path, t: int, folder: Path) -> Path:
    """A run folder holding what the coordinator had committed before round ``t`` (links into the
    copy ``run``): resumed on it, the real Coordinator is where it stood when it asked round t."""
    folder.mkdir(parents=True)
    for name in ("manifest.json", "run-id"):
        shutil.copy2(run / name, folder / name)
    if (run / "warmstart").exists():
        (folder / "warmstart").symlink_to((run / "warmstart").resolve(), target_is_directory=True)
    (folder / "rounds").mkdir()
    for k in range(t):
        (folder / "rounds" / f"round-{k:04d}").symlink_to((run / "rounds" / f"round-{k:04d}").resolve(),
                                                          target_is_directory=True)
    return folder


def _compare(metrics: dict[str, float], recorded: dict) -> dict[str, list[float]]:
    """{key: [replayed, recorded]} for every replayed metric the run recorded as a number."""
    out = {}
    for key, value in sorted(metrics.items()):
        rec = recorded.get(key)
        if isinstance(rec, (int, float)) and not isinstance(rec, bool) and value is not None:
            out[key] = [float(value), float(rec)]
    return out


def _load_run(run_dir: Path) -> tuple[LensembleConfig, dict, dict]:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    cfg = LensembleConfig.model_validate(manifest["config"])
    if cfg.config_hash() != manifest.get("config_hash"):
        raise ConfigError(f"{run_dir}/manifest.json pins config {str(manifest.get('config_hash'))[:16]}…, but its "
                          f"config hashes to {cfg.config_hash()[:16]}… with this code",
                          remediation="replay with the code the run was made with (manifest git_sha)")
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise ArtifactError(f"{run_dir} has no summary.json: not a finished federated run",
                            remediation="replay a run whose coordinator finished")
    summary = json.loads(summary_path.read_text())
    if summary.get("config_hash") != manifest["config_hash"]:
        raise ConfigError(f"{summary_path} belongs to config {str(summary.get('config_hash'))[:16]}…, "
                          f"the manifest to {manifest['config_hash'][:16]}…")
    if cfg.privacy.enabled:
        raise ConfigError(f"{run_dir} ran with privacy on: its participants released no probe embeddings, "
                          "so there is no participant drift to re-measure")
    return cfg, manifest, summary


def _silos(cfg: LensembleConfig) -> list[str]:
    """The participant ids of a run, in the in-process engine's order."""
    return [participant_id(i) for i in range(cfg.data.num_silos)]


def _word(flag: bool | None, yes: str, no: str, unknown: str) -> str:
    return unknown if flag is None else yes if flag else no


def _start_states(rounds: list[int], silos: list[str], saved_nodes: Path, work: Path) -> dict[int, dict[str, Path | None]]:
    """Where each replayed round's participants start: None (round 0), the state a replay of t-1 in
    this call leaves, or the run's saved state after t-1. Raises before anything runs if one is missing."""
    out: dict[int, dict[str, Path | None]] = {}
    replayed = set()
    for t in rounds:
        out[t] = {}
        for pid in silos:
            if t == 0:
                out[t][pid] = None
            elif t - 1 in replayed:
                out[t][pid] = state_file(work / f"round-{t - 1:04d}" / "nodes" / pid, t - 1)
            else:
                saved = state_file(saved_nodes / pid, t - 1)
                if not saved.is_file():
                    raise ArtifactError(
                        f"replaying round {t} needs {pid}'s inner-optimizer state after round {t - 1} "
                        f"({saved.name}), which the run no longer keeps (it keeps the last two rounds)",
                        remediation=f"replay rounds {list(range(t + 1))} from scratch, or a later round")
                out[t][pid] = saved
        replayed.add(t)
    return out


def _ask(cfg: LensembleConfig, node: NodeSpec, t: int, round_config: dict, global_arrays: dict, extras: dict):
    """One participant's reply, asked exactly as the in-process engine asks it (no deadline)."""
    errors: list[BaseException] = []

    def participant(*args):
        try:
            return participant_round(*args)
        except Exception as exc:  # kept so the replay can re-raise it with its traceback
            errors.append(exc)
            raise

    answers = ask_in_process(cfg, [node], participant=participant)(t, round_config, global_arrays, extras,
                                                                   threading.TIMEOUT_MAX)
    if node.participant_id not in answers.replies:
        why = answers.failures.get(node.participant_id, "no reply")
        raise RoundError(f"replayed round {t}: {node.participant_id} {why}") from (errors[0] if errors else None)
    return answers.replies[node.participant_id]


def replay_rounds(run_dir: str | os.PathLike, rounds: Iterable[int], *, work_dir: str | os.PathLike,
                  data_root: str | os.PathLike | None = None, progress: bool = True) -> list[dict]:
    """Replay ``rounds`` of the finished federated run in ``run_dir``; re-measure and verify each.

    Args:
        run_dir: a finished run folder (manifest.json, rounds/, nodes/, summary.json); only read.
        rounds: round indices (0-based) to replay, in any order; replayed in ascending order,
            each from the state the previous replayed round left, else from the run's saved state.
        work_dir: an empty (or new) folder for the copy of the run, the coordinator views and the
            replayed participant state (``round-XXXX/nodes/silo-K``) and drift report
            (``round-XXXX/drift.json``).
        data_root: the run's ``data.root`` as seen from here, when the config's (relative) one
            was relative to another folder (the study's working tree).
        progress: print one line per participant and round (round, silo, seconds) on stderr.

    Returns:
        One dict per replayed round: ``round``; ``metrics`` (``FrameDriftReport.summary_metrics()``
        of the replayed participants against the committed global); ``pairwise_metrics``;
        ``degenerate_mode`` ("mask"); ``state_bitwise_equal`` {silo: bool | None}; ``state_mismatches``
        {silo: differing paths}; ``start_state`` {silo: "none" | "replayed" | "saved"};
        ``global_hash_equal`` (bool | None); ``compared`` {metric: [replayed, recorded]};
        ``recorded_max_abs_diff`` / ``recorded_max_rel_diff`` (float | None: nothing recorded to
        compare); ``participant_seconds`` {silo: s}; ``seconds`` (wall time of the round, s).

    Raises:
        ConfigError: the config does not hash to the manifest's, privacy runs, a round out of
            range or with a dropped participant, no collection at the data root.
        ArtifactError: a needed inner state is not kept, or the work folder is not empty.
        CheckpointIntegrityError: a checkpoint is corrupt, or the global the coordinator would
            have sent is not the checkpoint that was committed.
    """
    run_dir = Path(run_dir).resolve()
    work = Path(work_dir).resolve()
    if work.exists() and any(work.iterdir()):
        raise ArtifactError(f"work folder {work} is not empty", remediation="pass a new or empty work_dir")
    if work == run_dir or run_dir in work.parents:
        raise ArtifactError(f"work folder {work} lies inside the run folder {run_dir}, which a replay never writes")
    cfg, manifest, summary = _load_run(run_dir)
    recorded = {int(r["round"]): r for r in summary.get("rounds", [])}
    todo = sorted({int(t) for t in rounds})
    done = int(summary.get("rounds_completed", len(recorded)))
    for t in todo:
        if not 0 <= t < done or t not in recorded:
            raise ConfigError(f"round {t} is not a committed round of {run_dir} (rounds 0..{done - 1})")
        if recorded[t].get("dropped") or recorded[t].get("fed/participants", cfg.data.num_silos) != cfg.data.num_silos:
            raise ConfigError(f"round {t} of {run_dir} dropped participants ({recorded[t].get('dropped')}): "
                              "replaying it is not supported")

    silos = _silos(cfg)
    kept_nodes = Path(cfg.federation.state_dir).resolve() if cfg.federation.state_dir else run_dir / "nodes"
    _start_states(todo, silos, kept_nodes, work)  # refuse before copying anything
    run_id = (run_dir / "run-id").read_text().strip()
    for pid in silos:
        owner = kept_nodes / pid / OWNER_FILE
        if owner.is_file() and json.loads(owner.read_text()).get("run_id") != run_id:
            raise ConfigError(f"{owner} names another run than {run_dir}/run-id ({run_id})")

    work.mkdir(parents=True, exist_ok=True)
    run = work / "run"
    run.mkdir()
    for name in _COPIED:
        src = run_dir / name
        if src.is_dir():
            shutil.copytree(src, run / name, symlinks=True, ignore=shutil.ignore_patterns(".lensemble.lock"))
        elif src.is_file():
            shutil.copy2(src, run / name)
    saved_nodes = Path(cfg.federation.state_dir).resolve() if cfg.federation.state_dir else run / "nodes"
    starts = _start_states(todo, silos, saved_nodes, work)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the study ran: one torch thread for coordinator and participants
    try:
        return [_replay_round(cfg, manifest, recorded[t], run, t, starts[t], saved_nodes, work, data_root, progress)
                for t in todo]
    finally:
        torch.set_num_threads(threads)


def _replay_round(cfg: LensembleConfig, manifest: dict, recorded: dict, run: Path, t: int,
                  start: dict[str, Path | None], saved_nodes: Path, work: Path, data_root, progress: bool) -> dict:
    started = time.perf_counter()
    here = work / f"round-{t:04d}"
    view = _coordinator_view(run, t, here / "coordinator")
    if not cfg.federation.warmstart and _own_warmstart(cfg, view / "warmstart") is None:
        raise ArtifactError(f"{run} has no usable warmstart/ of its own (the coordinator would train one)")
    with _data_root(cfg, data_root, work) as data_path:
        _check_collection(cfg, manifest["probe_hash"])
        coord = Coordinator(cfg, view, progress=False)
    try:
        if coord.next_round != t:
            raise CheckpointIntegrityError(f"the coordinator resumed at round {coord.next_round}, not {t}")
        # What the in-process engine sent: coordinator.global_arrays(), which is the committed
        # previous round (or the warm start) as load_checkpoint reads it; both are checked.
        sent = load_checkpoint(run / "rounds" / f"round-{t - 1:04d}" / "model") if t > 0 else \
            load_checkpoint(coord.warmstart_dir, expected_hash=manifest["warmstart_hash"])
        global_arrays = to_arrays(sent.tensors)
        if bad := _arrays_equal(global_arrays, coord.global_arrays()):
            raise CheckpointIntegrityError(f"round {t}: the global the coordinator holds differs from "
                                           f"{sent.path} in {bad[:4]}")
        round_config = coord.round_config(t)
        extras = dict(coord.extras or {})
        state_dir = here / "nodes"
        replies, seconds, equal, mismatches, source = {}, {}, {}, {}, {}
        for i, pid in enumerate(_silos(cfg)):
            folder = state_dir / pid
            folder.mkdir(parents=True)
            owner = saved_nodes / pid / OWNER_FILE
            if owner.is_file():
                shutil.copy2(owner, folder / OWNER_FILE)
            if start[pid] is not None:
                shutil.copy2(start[pid], folder / start[pid].name)
            source[pid] = "none" if start[pid] is None else (
                "saved" if start[pid].parent == saved_nodes / pid else "replayed")
            node = NodeSpec(i, None if data_path is None else str(data_path), str(state_dir))
            s0 = time.perf_counter()
            replies[pid] = _ask(cfg, node, t, round_config, global_arrays, extras)
            seconds[pid] = round(time.perf_counter() - s0, 2)
            kept = state_file(saved_nodes / pid, t)
            if kept.is_file():
                diff = states_equal(torch.load(state_file(folder, t), weights_only=True),
                                    torch.load(kept, weights_only=True))
                equal[pid], mismatches[pid] = not diff, diff[:8]
            else:
                equal[pid], mismatches[pid] = None, []
            _say(progress, f"round {t} {pid}: {seconds[pid]:.1f} s, inner state "
                           f"{_word(equal[pid], 'bitwise equal', 'DIFFERS', 'not kept by the run')}")

        # The committed global (statistics already recalibrated) embeds the probe as the
        # coordinator's did after its recalibration; the drift is measured before the coordinator
        # closes the round, on the measurement frames, as Coordinator._drift measures it.
        committed = load_checkpoint(run / "rounds" / f"round-{t:04d}" / "model")
        model = world_model_from_state(architecture(cfg.model), committed.tensors)
        global_emb = embed_frames(model.encoder, coord.probe)
        ms = torch.from_numpy(coord.split.measurement_idx)
        emb = {p: torch.from_numpy(replies[p].probe_embeddings)[ms] for p in sorted(replies)}
        emb[GLOBAL_KEY] = global_emb[ms]
        report = coord._drift(emb, t)  # the coordinator's own measurement (degenerate pairs masked)
        global_hash_equal = None
        if not cfg.federation.secure_aggregation:
            coord.close_round(t, replies, {})
            global_hash_equal = coord.head_hash == committed.content_hash
    finally:
        coord.finish()
    metrics, pairwise = report.summary_metrics(), report.pairwise_metrics()
    (here / "drift.json").write_text(report.model_dump_json(indent=1))
    compared = _compare({**metrics, **pairwise}, recorded)
    abs_diffs = [abs(a - b) for a, b in compared.values()]
    rel_diffs = [0.0 if a == b else abs(a - b) / abs(b) if b != 0 else math.inf for a, b in compared.values()]
    out = {
        "round": t, "metrics": metrics, "pairwise_metrics": pairwise, "degenerate_mode": "mask",
        "state_bitwise_equal": equal, "state_mismatches": mismatches, "start_state": source,
        "global_hash_equal": global_hash_equal, "compared": compared,
        "recorded_max_abs_diff": max(abs_diffs) if abs_diffs else None,
        "recorded_max_rel_diff": max(rel_diffs) if rel_diffs else None,
        "participant_seconds": seconds, "seconds": round(time.perf_counter() - started, 2),
    }
    _say(progress, f"round {t}: {out['seconds']:.1f} s, global hash "
                   f"{_word(global_hash_equal, 'equal', 'DIFFERS', 'not checked')}, "
                   f"recorded metrics max |Δ| {out['recorded_max_abs_diff']}")
    return out


