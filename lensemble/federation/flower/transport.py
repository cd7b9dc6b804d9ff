"""Asking the participants over a Flower Grid: the AskFn the ServerApp gives the round driver.

One attempt at round t:

1. wait, at most the round deadline, until ``federation.min_participants`` nodes are online (and
   briefly longer for the rest of the ``data.num_silos`` sites);
2. send every node one "train" message: the global arrays (ArrayRecord ``arrays``), the round
   config (ConfigRecord ``config``) and, if the coordinator has them, public side inputs
   (ArrayRecord ``extras``, e.g. anchor targets), with a TTL just above the deadline so a stale
   instruction is never executed late;
3. ``grid.send_and_receive(..., timeout=deadline)``: a dead or slow node costs this one
   deadline, never a hang;
4. sort the replies into Reply objects keyed by participant id, and failures with a reason:
   error replies, missing replies, malformed or disallowed replies — except a participant's
   fail-closed error (ResidencyViolation, PrivacyBudgetExceeded, ...), which is raised here and
   stops the run as it does in the framework-free engine.

``wire_bytes`` is the serialised array data actually sent and received: the global (and extras)
ArrayRecords once per node plus every reply's ArrayRecords (``Array.data``, the ``np.save`` bytes;
record keys and protobuf framing are not counted).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import ArrayRecord, Message, RecordDict
from flwr.serverapp import Grid

from lensemble import errors
from lensemble.config.schema import LensembleConfig
from lensemble.errors import FaultToleranceExceeded, LensembleError
from lensemble.federation.flower.records import (
    ARRAYS,
    CONFIG,
    EXTRAS,
    arrays_to_record,
    config_to_record,
    content_to_reply,
    copy_record,
    record_nbytes,
    reply_nbytes,
)
from lensemble.federation.messages import Reply, participant_id
from lensemble.federation.rounds import Answers

TRAIN = "train"
# After min_participants nodes are online, wait this much longer for the remaining sites before a
# round starts; short, so that a dead site costs seconds here and one round deadline below.
NODE_GRACE_S = 3.0
NODE_POLL_S = 0.5
# A message outlives the round deadline by this margin (clock skew), then expires unexecuted.
TTL_MARGIN_S = 10.0
REASON_MAX_CHARS = 400


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
    invariant must stop the run (DESIGN.md section 9), as it does in the framework-free engine;
    any other error only costs that participant its update for the round.
    """
    match = re.match(r"<class '([\w.]+)'>", reason or "")
    if not match:
        return
    module, _, name = match.group(1).rpartition(".")
    cls = getattr(errors, name, None) if module == errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, LensembleError) and cls.fail_closed:
        raise cls(f"participant {who} stopped with a fail-closed error: {_short(reason)}")


def collect_replies(replies: Iterable[Message], node_ids: list[int], *, timeout_s: float,
                    labels: dict[int, str]) -> tuple[dict[str, Reply], dict[str, str], int]:
    """Sort replies into ``(ok, failures, received_bytes)``.

    ``ok``: participant id -> Reply; ``failures``: participant id (or ``node-<id>`` while a node's
    partition is unknown) -> reason. ``labels`` (node id -> participant id) is updated in place and
    remembered across rounds so a node that fails later is reported under its participant id.
    An error reply carrying a fail-closed Lensemble error raises it (:func:`raise_if_fail_closed`).
    """
    ok: dict[str, Reply] = {}
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
            reply, pid = content_to_reply(msg.content, Reply)
        except (LensembleError, ValueError, KeyError, TypeError) as exc:
            failures[label(nid)] = _short(f"malformed reply: {exc}")
            continue
        key = participant_id(pid)
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


class GridAsk:
    """The AskFn over ``grid`` for the federation ``cfg`` (see the module docstring)."""

    def __init__(self, grid: Grid, cfg: LensembleConfig):
        self.grid = grid
        self.cfg = cfg
        self.labels: dict[int, str] = {}  # node id -> participant id, remembered across rounds

    def __call__(self, t: int, round_config: dict, global_arrays: dict, extras: dict,
                 deadline_s: float) -> Answers:
        fed = self.cfg.federation
        node_ids = wait_for_nodes(self.grid, want=fed.min_participants, hope=self.cfg.data.num_silos,
                                  deadline_s=deadline_s)
        global_rec = arrays_to_record(global_arrays)
        extras_rec = arrays_to_record(extras) if extras else None
        messages = [Message(_instruction(global_rec, round_config, extras_rec), nid, TRAIN,
                            ttl=deadline_s + TTL_MARGIN_S, group_id=str(t))
                    for nid in node_ids]
        per_node = record_nbytes(global_rec) + (record_nbytes(extras_rec) if extras_rec is not None else 0)
        replies = self.grid.send_and_receive(messages, timeout=deadline_s)
        ok, failures, received = collect_replies(replies, node_ids, timeout_s=deadline_s, labels=self.labels)
        return Answers(replies=ok, failures=failures, asked=len(node_ids),
                       wire_bytes=per_node * len(messages) + received)


__all__ = ["GridAsk", "wait_for_nodes", "collect_replies", "raise_if_fail_closed"]
