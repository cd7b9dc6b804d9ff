"""The coordinator's ServerApp: its own round loop over ``grid.send_and_receive``.

For each round t from ``coordinator.next_round`` to ``num_rounds - 1``:

1. wait, at most ``federation.round_timeout_s``, until ``federation.min_participants`` nodes are
   online (and briefly longer for the rest of the ``data.num_silos`` sites);
2. send every node one "train" message: the global arrays (ArrayRecord ``arrays``), the round
   config (ConfigRecord ``config``) and, if the coordinator has them, public side inputs
   (ArrayRecord ``extras``, e.g. anchor targets), with a TTL just above the round timeout so a
   stale instruction is never executed late;
3. ``grid.send_and_receive(..., timeout=federation.round_timeout_s)``: a dead or slow node costs
   this one timeout, never a hang;
4. turn replies into ``Reply`` objects keyed by participant id (the roles' ``NodeSpec``
   labels); error replies, missing replies and malformed or disallowed replies become failures
   with a reason, except a participant's fail-closed error (ResidencyViolation,
   PrivacyBudgetExceeded, ...), which stops the run as it does in the in-process engine;
5. ``coordinator.close_round(t, replies, failures, wire_bytes, seconds)``. On
   FaultToleranceExceeded (from the node wait or from the coordinator's quorum) the round is
   tried again, ``federation.round_retries`` more times, then the error propagates.

``wire_bytes`` is the serialised array data actually sent and received this round: the global
(and extras) ArrayRecords once per node plus every reply's ArrayRecords (``Array.data``, the
``np.save`` bytes; record keys and protobuf framing are not counted).
"""

from __future__ import annotations

import inspect
import json
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from lensemble import errors
from lensemble.config.loader import load_config
from lensemble.config.schema import LensembleConfig, validate_config
from lensemble.errors import FaultToleranceExceeded, LensembleError
from lensemble.federation.flower import load_roles, merge_run_config
from lensemble.federation.flower.records import (
    ARRAYS,
    CONFIG,
    EXTRAS,
    arrays_to_record,
    config_to_record,
    content_to_reply,
    copy_record,
    participant_id,
    record_nbytes,
    reply_nbytes,
)
from lensemble.federation.validation import retry_or_raise

TRAIN = "train"
# After min_participants nodes are online, wait this much longer for the remaining sites before a
# round starts; short, so that a dead site costs seconds here and one round timeout below.
NODE_GRACE_S = 3.0
NODE_POLL_S = 0.5
# A message outlives the round timeout by this margin (clock skew), then expires unexecuted.
TTL_MARGIN_S = 10.0
REASON_MAX_CHARS = 400


def resolve_config(run_config: Mapping[str, Any]) -> LensembleConfig:
    """The run's config: ``config-json`` if given, else the Hydra ``overrides`` string."""
    blob = run_config.get("config-json")
    if blob:
        return validate_config(json.loads(str(blob)))
    return load_config(shlex.split(str(run_config.get("overrides") or "")))


def resolve_run_dir(cfg: LensembleConfig, run_config: Mapping[str, Any]) -> Path:
    """``run-dir`` from the run config, else ``cfg.run_dir``; relative paths are made absolute here."""
    return Path(str(run_config.get("run-dir") or cfg.run_dir)).expanduser().resolve()


def wait_for_nodes(grid: Grid, *, want: int, hope: int, deadline_s: float,
                   grace_s: float = NODE_GRACE_S, poll_s: float = NODE_POLL_S) -> list[int]:
    """Sorted ids of the online nodes once ``hope`` are online, or ``want`` plus ``grace_s``.

    Raises FaultToleranceExceeded when fewer than ``want`` are online after ``deadline_s``.
    """
    start = time.monotonic()
    enough_since: float | None = None
    while True:
        ids = sorted(int(n) for n in grid.get_node_ids())
        now = time.monotonic()
        if len(ids) >= hope:
            return ids
        if len(ids) >= want:
            enough_since = enough_since if enough_since is not None else now
            if now - enough_since >= grace_s or now - start >= deadline_s:
                return ids
        else:
            enough_since = None
            if now - start >= deadline_s:
                raise FaultToleranceExceeded(
                    f"only {len(ids)} node(s) online after {deadline_s:g} s, quorum is {want}",
                    accepted=len(ids), min_participants=want)
        time.sleep(poll_s)


def _short(text: str | None) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= REASON_MAX_CHARS else text[:REASON_MAX_CHARS] + "..."


def raise_if_fail_closed(who: str, reason: str | None) -> None:
    """Re-raise a participant's fail-closed Lensemble error (residency, privacy, ...) here.

    Flower reports a ClientApp exception as ``"<class 'module.Name'>:<'message'>"``. A broken
    invariant must stop the run (DESIGN.md section 9), as it does in the in-process engine; any
    other error only costs that participant its update for the round.
    """
    match = re.match(r"<class '([\w.]+)'>", reason or "")
    if not match:
        return
    module, _, name = match.group(1).rpartition(".")
    cls = getattr(errors, name, None) if module == errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, LensembleError) and cls.fail_closed:
        raise cls(f"participant {who} stopped with a fail-closed error: {_short(reason)}")


def collect_replies(replies: Iterable[Message], node_ids: list[int], reply_cls: type, *,
                    timeout_s: float, labels: dict[int, str], node_cls: type | None = None):
    """Sort replies into ``(ok, failures, received_bytes)``.

    ``ok``: participant id -> Reply; ``failures``: participant id (or ``node-<id>`` while a node's
    partition is unknown) -> reason. ``labels`` (node id -> participant id) is updated in place and
    remembered across rounds so a node that fails later is reported under its participant id.
    Participant ids come from ``node_cls`` (the roles' NodeSpec), see ``records.participant_id``.
    An error reply carrying a fail-closed Lensemble error raises it (:func:`raise_if_fail_closed`).
    """
    ok: dict[str, Any] = {}
    failures: dict[str, str] = {}
    owner: dict[str, int] = {}
    received = 0
    seen: set[int] = set()
    expected = set(node_ids)

    def label(nid: int) -> str:
        return labels.get(nid, f"node-{nid}")

    for msg in sorted(replies, key=lambda m: m.metadata.src_node_id):
        nid = int(msg.metadata.src_node_id)
        if nid not in expected or nid in seen:
            continue  # not asked this round, or a duplicate reply: ignore it
        seen.add(nid)
        if msg.has_error():
            err = msg.error
            raise_if_fail_closed(label(nid), err.reason)
            failures[label(nid)] = _short(f"error reply (code {err.code}): {err.reason}")
            continue
        received += reply_nbytes(msg.content)
        try:
            reply, pid = content_to_reply(msg.content, reply_cls)
        except (LensembleError, ValueError, KeyError, TypeError) as exc:
            failures[label(nid)] = _short(f"malformed reply: {exc}")
            continue
        key = participant_id(pid, node_cls)
        if key in owner:
            failures[f"node-{nid}"] = f"duplicate partition-id {pid} (also sent by node {owner[key]})"
            continue
        owner[key] = nid
        labels.setdefault(nid, key)
        ok[key] = reply
    for nid in sorted(expected - seen):
        failures[label(nid)] = f"no reply within {timeout_s:g} s"
    return ok, failures, received


def _instruction(global_rec: ArrayRecord, round_config: Mapping[str, Any],
                 extras_rec: ArrayRecord | None) -> RecordDict:
    content = RecordDict({ARRAYS: copy_record(global_rec), CONFIG: config_to_record(round_config)})
    if extras_rec is not None:
        content[EXTRAS] = copy_record(extras_rec)
    return content


def run_round(grid: Grid, coordinator: Any, t: int, cfg: LensembleConfig, roles: ModuleType,
              labels: dict[int, str]) -> tuple[dict, dict]:
    """One attempt at round ``t``; returns ``(coordinator's round metrics, transport numbers)``."""
    fed = cfg.federation
    node_ids = wait_for_nodes(grid, want=fed.min_participants, hope=cfg.data.num_silos,
                              deadline_s=fed.round_timeout_s)
    start = time.monotonic()
    global_rec = arrays_to_record(coordinator.global_arrays())
    extras = getattr(coordinator, "extras", None)  # public side inputs (anchor targets), optional
    extras_rec = arrays_to_record(extras) if extras else None
    round_config = coordinator.round_config(t)
    messages = [Message(_instruction(global_rec, round_config, extras_rec), nid, TRAIN,
                        ttl=fed.round_timeout_s + TTL_MARGIN_S, group_id=str(t))
                for nid in node_ids]
    per_node = record_nbytes(global_rec) + (record_nbytes(extras_rec) if extras_rec is not None else 0)
    sent = per_node * len(messages)
    replies = grid.send_and_receive(messages, timeout=fed.round_timeout_s)
    ok, failures, received = collect_replies(replies, node_ids, roles.Reply, timeout_s=fed.round_timeout_s,
                                             labels=labels, node_cls=getattr(roles, "NodeSpec", None))
    seconds = time.monotonic() - start
    metrics = coordinator.close_round(t, ok, failures, wire_bytes=sent + received, seconds=seconds)
    transport = {"nodes": len(node_ids), "replies": len(ok), "failures": failures,
                 "bytes_sent": sent, "bytes_received": received, "seconds": seconds}
    return metrics or {}, transport


def _human_bytes(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"


def _progress_line(t: int, total: int, transport: dict, attempt: int) -> str:
    wire = _human_bytes(transport["bytes_sent"] + transport["bytes_received"])
    retry = f" (attempt {attempt})" if attempt > 1 else ""
    line = (f"[lensemble] round {t + 1}/{total}{retry}: {transport['replies']}/{transport['nodes']} "
            f"replies, {wire} on the wire, {transport['seconds']:.1f} s")
    for who, why in sorted(transport["failures"].items()):
        line += f"\n[lensemble]   {who} failed: {why}"
    return line


def run_federation(grid: Grid, run_config: Mapping[str, Any]) -> dict:
    """Build the Coordinator from ``run_config`` and run its remaining rounds; returns finish()."""
    run_config = merge_run_config(run_config)
    cfg = resolve_config(run_config)
    run_dir = resolve_run_dir(cfg, run_config)
    roles = load_roles(str(run_config["roles"]))
    progress = bool(run_config.get("progress", True))
    if "progress" in inspect.signature(roles.Coordinator).parameters:
        coordinator = roles.Coordinator(cfg, run_dir, progress=progress)
    else:
        coordinator = roles.Coordinator(cfg, run_dir)
    total = int(coordinator.num_rounds)
    labels: dict[int, str] = {}
    if progress:
        print(f"[lensemble] coordinator: rounds {coordinator.next_round + 1}..{total} of {total}, "
              f"quorum {cfg.federation.min_participants}/{cfg.data.num_silos}, run dir {run_dir}",
              flush=True)
    for t in range(int(coordinator.next_round), total):
        attempt = 1
        while True:
            try:
                _, transport = run_round(grid, coordinator, t, cfg, roles, labels)
                break
            except FaultToleranceExceeded as err:
                if progress:
                    print(f"[lensemble] round {t + 1}/{total} attempt {attempt} failed: {err.message}",
                          flush=True)
                retry_or_raise(err, attempt, cfg.federation.round_retries)  # re-raises when spent
                attempt += 1
        if progress:
            print(_progress_line(t, total, transport, attempt), flush=True)
    summary = coordinator.finish()
    if progress:
        print(f"[lensemble] federation finished: {total} rounds, run dir {run_dir}", flush=True)
    return summary


def make_server_app(run_config: Mapping[str, Any] | None = None,
                    on_finish: Callable[[dict], None] | None = None) -> ServerApp:
    """A ServerApp running :func:`run_federation`.

    ``run_config`` is laid over ``context.run_config`` (Flower's deprecated ``run_simulation``
    leaves the latter empty); ``on_finish`` receives the coordinator's summary.
    """
    baked = dict(run_config or {})
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        summary = run_federation(grid, merge_run_config(context.run_config, baked))
        if on_finish is not None:
            on_finish(summary)

    return server


app = make_server_app()

__all__ = ["app", "make_server_app", "run_federation", "run_round", "collect_replies",
           "raise_if_fail_closed", "wait_for_nodes", "resolve_config", "resolve_run_dir"]
