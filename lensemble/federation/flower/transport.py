"""Asking the participants over a Flower Grid: the AskFn the ServerApp gives the round driver.

One attempt at round t:

1. collect what came back for earlier messages still outstanding (a node that missed a deadline
   stays *busy* until a reply of its own arrives, until it drops off the grid, or until one more
   deadline has passed since the link reported its message expired), and drop it: a late reply
   never enters a later round;
2. wait, at most the round deadline, until ``federation.min_participants`` nodes that are not
   busy are online (and briefly longer for the rest of the ``data.num_silos`` sites);
3. send every such node one "train" message: the global arrays (ArrayRecord ``arrays``), the round
   config (ConfigRecord ``config``) and, if the coordinator has them, public side inputs
   (ArrayRecord ``extras``, e.g. anchor targets), with a TTL just above the deadline so a stale
   instruction is never executed late. A busy node gets nothing: a hung node costs one deadline,
   then its silo is reported "still busy" each round without delaying anyone;
4. pull replies until all have arrived or the deadline passes (``push_messages`` /
   ``pull_messages``, so the ids of the unanswered ones are remembered for step 1);
5. sort the replies into Reply objects keyed by participant id, and failures with a reason:
   error replies, missing replies, malformed or disallowed replies — except a participant's
   fail-closed error (ResidencyViolation, PrivacyBudgetExceeded, ...), which is raised here and
   stops the run as it does in the framework-free engine. An error reply is reported by its
   class and code only (``failed: RoundError [round_failed]``): its text came from a silo.

``cancel`` (a threading.Event) ends any wait at once with a RoundError: the Ray launcher sets it
on Ctrl-C so the ServerApp thread does not outlive the driver.

``wire_bytes`` is the serialised array data actually sent and received: the global (and extras)
ArrayRecords once per node plus every reply's ArrayRecords (``Array.data``, the ``np.save`` bytes;
record keys and protobuf framing are not counted). A train ask after the pooled objective's
summary ask sends no global to the participants that kept it (:func:`global_for`), and counts
none for them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid

from lensemble import errors
from lensemble.config.schema import LensembleConfig
from lensemble.errors import FaultToleranceExceeded, LensembleError, RoundError
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
from lensemble.federation.global_cache import holders
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
# Polling the grid for replies: Flower's own send_and_receive sleeps 3 s between pulls over HTTP;
# an in-memory grid says how often it can be asked (``pull_interval``).
PULL_S = 1.0
_CLASS = re.compile(r"<class '([\w.]+)'>")
# the partition id a ClientApp appends to its sanitised error (client_app.sanitised)
_SILO = re.compile(r"lensemble-silo:(\d{1,6})\b")
_MARKER = re.compile(r"lensemble-error:([A-Za-z_]\w{0,63})(?::([A-Za-z_]\w{0,63}))?")


def _cancelled(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise RoundError("the run was cancelled", remediation="start it again to resume")


def wait_for_nodes(grid: Grid, *, want: int, hope: int, deadline_s: float,
                   grace_s: float = NODE_GRACE_S, poll_s: float = NODE_POLL_S,
                   busy: Callable[[], set[int]] | None = None,
                   cancel: threading.Event | None = None) -> list[int]:
    """Sorted ids of the online, not busy nodes once ``hope`` are, or ``want`` plus ``grace_s``.

    ``busy()`` (re-read every poll) names nodes that are online but still working on an earlier
    message; they are not counted. Raises FaultToleranceExceeded when fewer than ``want`` are
    available after ``deadline_s``, naming the busy ones.
    """
    start = time.monotonic()
    enough_since: float | None = None
    while True:
        _cancelled(cancel)
        online = sorted(int(n) for n in grid.get_node_ids())
        taken = busy() if busy is not None else set()
        ids = [n for n in online if n not in taken]
        now = time.monotonic()
        # all the free sites we may hope for (a busy one is not waited for), but never fewer than
        # the quorum: with too few free, wait for busy ones to answer, up to the deadline
        if len(ids) >= max(want, hope - len(taken & set(online))):
            return ids
        if len(ids) >= want:
            enough_since = enough_since if enough_since is not None else now
            if now - enough_since >= grace_s or now - start >= deadline_s:
                return ids
        else:
            enough_since = None
            if now - start >= deadline_s:
                held = len(taken & set(online))
                also = f", {held} more still busy with an earlier round" if held else ""
                raise FaultToleranceExceeded(
                    f"only {len(ids)} node(s) online and free after {deadline_s:g} s{also}; quorum is {want}",
                    accepted=len(ids), min_participants=want)
        time.sleep(poll_s)


def _short(text: str | None) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= REASON_MAX_CHARS else text[:REASON_MAX_CHARS] + "..."


def _parse_reason(reason: str | None) -> tuple[type | None, str]:
    """(the Lensemble error class, a label) of a Flower error reason; never its free text.

    The ClientApp re-raises every error as a sanitised one whose message is a marker
    (``lensemble-error:Name`` or ``lensemble-error:ParticipantFailed:Name``, see
    :func:`~lensemble.federation.flower.client_app.sanitised`), found wherever the runtime put it:
    in a SuperNode's or the in-process grid's ``"<class 'pkg.Name'>:<'...'>"``, or inside Ray's
    ``ClientAppException`` text. Without a marker the label is the leading class name (Flower's
    own errors), or "unknown error".
    """
    found = _MARKER.search(reason or "")
    if found:
        cls = getattr(errors, found.group(1), None)
        if isinstance(cls, type) and issubclass(cls, LensembleError):
            if cls is errors.ParticipantFailed and found.group(2):
                return cls, found.group(2)
            return cls, errors.class_label(cls)  # a storage error keeps its fixed cause phrase
    match = _CLASS.match(reason or "")
    return None, (match.group(1).rpartition(".")[2] if match else "unknown error")


def error_reason_label(reason: str | None) -> str:
    """``"RoundError [round_failed]"`` for a sanitised Lensemble error, the foreign class name
    (``"RuntimeError"``) for any other participant error; never the text after it."""
    return _parse_reason(reason)[1]


def raise_if_fail_closed(who: str, reason: str | None) -> None:
    """Re-raise a participant's fail-closed Lensemble error (residency, privacy, ...) here.

    A broken invariant must stop the run (DESIGN.md section 9), as it does in the framework-free
    engine, on every runtime (the marker is found inside Ray's wrapper too); any other error only
    costs that participant its update for the round.
    """
    cls, label = _parse_reason(reason)
    if cls is not None and cls.fail_closed:
        raise cls(f"participant {who} stopped with a fail-closed error: {label}")


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
            learn_silo(labels, nid, err.reason)
            raise_if_fail_closed(label(nid), err.reason)
            failures[label(nid)] = f"failed: {error_reason_label(err.reason)} (Flower error {err.code})"
            continue
        received += reply_nbytes(msg.content)
        try:
            reply, pid = content_to_reply(msg.content, Reply)
        except (LensembleError, ValueError, KeyError, TypeError) as exc:
            failures[label(nid)] = _short(f"sent a malformed reply: {exc}")
            continue
        key = participant_id(pid)
        if key in owner:
            failures[f"node-{nid}"] = f"sent a duplicate partition-id {pid} (also sent by node {owner[key]})"
            continue
        owner[key] = nid
        labels.setdefault(nid, key)
        ok[key] = reply
    for nid in sorted(expected - seen):
        failures[label(nid)] = f"did not reply within {timeout_s:g} s"
    return ok, failures, received


def learn_silo(labels: dict[int, str], nid: int, reason: str | None) -> None:
    """Name a node that failed before it ever replied by the partition id its error carries
    (``lensemble-silo:<i>``), unless another node already answers to that name."""
    found = _SILO.search(reason or "")
    if nid in labels or not found:
        return
    name = participant_id(int(found.group(1)))
    if name not in labels.values():
        labels[nid] = name


def global_for(participant: str | None, round_config: Mapping[str, Any], global_rec: ArrayRecord) -> ArrayRecord:
    """What a node's instruction carries as the global: nothing for a participant that kept the
    round's global from its summary ask (named in the round config), the global otherwise (also
    for a node whose participant is not known yet)."""
    return ArrayRecord() if participant is not None and participant in holders(round_config) else global_rec


def _instruction(global_rec: ArrayRecord, round_config: Mapping[str, Any],
                 extras_rec: ArrayRecord | None) -> RecordDict:
    content = RecordDict({ARRAYS: copy_record(global_rec), CONFIG: config_to_record(round_config)})
    if extras_rec is not None:
        content[EXTRAS] = copy_record(extras_rec)
    return content


@dataclass
class Outstanding:
    """A message a node has not answered yet: its id, the round it was for, when it was sent
    and, once the link reported it expired unanswered, when that was (monotonic seconds)."""

    message_id: str
    round_index: int
    sent: float
    expired: float | None = None


class GridAsk:
    """The AskFn over ``grid`` for the federation ``cfg`` (see the module docstring).

    ``outstanding`` (node id -> :class:`Outstanding`) survives across rounds: a node is sent
    nothing new while its previous message is unanswered.
    """

    def __init__(self, grid: Grid, cfg: LensembleConfig, *, cancel: threading.Event | None = None):
        self.grid = grid
        self.cfg = cfg
        self.cancel = cancel
        self.labels: dict[int, str] = {}  # node id -> participant id, remembered across rounds
        self.outstanding: dict[int, Outstanding] = {}
        self.cooldown_s = float(cfg.federation.round_timeout_s)
        self.poll_s = min(float(getattr(grid, "pull_interval", PULL_S) or PULL_S), PULL_S)

    def _reap(self) -> set[int]:
        """Collect (and drop) late replies to outstanding messages; return the still-busy nodes.

        A node is free again once a reply *from it* arrives (even an error), or once it is no
        longer online (whatever it ran went with it). When the link reports the message expired
        unanswered (the node may be stuck in it, or its reply came too late to be kept), the node
        is left alone for one more round deadline, then asked again: a node stuck for good costs
        one deadline now and then, never a hang, and a merely slow one is not shut out for ever.
        """
        if not self.outstanding:
            return set()
        online = {int(n) for n in self.grid.get_node_ids()}
        for nid in [n for n in self.outstanding if n not in online]:
            del self.outstanding[nid]  # off the grid: whatever it was running is gone with it
        by_id = {o.message_id: nid for nid, o in self.outstanding.items() if o.message_id}
        if by_id:
            for msg in self.grid.pull_messages(list(by_id)):
                nid = by_id.get(msg.metadata.reply_to_message_id)
                if nid is None:
                    continue
                if int(msg.metadata.src_node_id) != SUPERLINK_NODE_ID:
                    self.outstanding.pop(nid, None)  # the node answered (late): it is free
                elif msg.has_error() and msg.error.code == ErrorCode.NODE_UNAVAILABLE:
                    self.outstanding.pop(nid, None)  # offline: gone with what it ran
                else:  # expired in the link: nothing more to pull; the cool-down starts now
                    self.outstanding[nid].message_id = ""
                    self.outstanding[nid].expired = time.monotonic()
        now = time.monotonic()
        for nid in [n for n, o in self.outstanding.items()
                    if o.expired is not None and now - o.expired >= self.cooldown_s]:
            del self.outstanding[nid]
        return set(self.outstanding)

    def __call__(self, t: int, round_config: dict, global_arrays: dict, extras: dict,
                 deadline_s: float) -> Answers:
        fed = self.cfg.federation
        self.cooldown_s = deadline_s
        node_ids = wait_for_nodes(self.grid, want=fed.min_participants, hope=self.cfg.data.num_silos,
                                  deadline_s=deadline_s, busy=self._reap, cancel=self.cancel)
        global_rec = arrays_to_record(global_arrays)
        extras_rec = arrays_to_record(extras) if extras else None
        # a participant that kept this round's global from its summary ask gets none (its digest
        # is in the round config: federation/global_cache.py)
        recs = {nid: global_for(self.labels.get(nid), round_config, global_rec) for nid in node_ids}
        messages = [Message(_instruction(recs[nid], round_config, extras_rec), nid, TRAIN,
                            ttl=deadline_s + TTL_MARGIN_S, group_id=str(t))
                    for nid in node_ids]
        extras_bytes = record_nbytes(extras_rec) if extras_rec is not None else 0
        ids = list(self.grid.push_messages(messages))
        ids += [None] * (len(node_ids) - len(ids))  # a grid reports a message it could not push as None
        pending = {str(mid): nid for mid, nid in zip(ids, node_ids, strict=False) if mid}
        unsent = [nid for mid, nid in zip(ids, node_ids, strict=False) if not mid]
        sent = time.monotonic()
        replies: list[Message] = []
        offline: dict[int, float] = {}  # nodes the link reported gone mid-round -> seconds in
        # The deadline counts from when the messages left, as Flower's send_and_receive does.
        while pending and time.monotonic() - sent < deadline_s:
            _cancelled(self.cancel)
            got = list(self.grid.pull_messages(list(pending)))
            for msg in got:
                nid = pending.pop(msg.metadata.reply_to_message_id, None)
                if nid is None:
                    continue
                if int(msg.metadata.src_node_id) == SUPERLINK_NODE_ID and msg.has_error():
                    # The link answered for the node: it went offline (missed heartbeats), or the
                    # message expired unanswered while the node may still be working on it.
                    if msg.error.code == ErrorCode.NODE_UNAVAILABLE:
                        offline[nid] = time.monotonic() - sent
                    else:
                        self.outstanding[nid] = Outstanding("", t, sent, expired=time.monotonic())
                    continue
                replies.append(msg)
            if pending:
                time.sleep(min(self.poll_s, max(0.0, deadline_s - (time.monotonic() - sent))))
        for mid, nid in pending.items():
            self.outstanding[nid] = Outstanding(mid, t, sent)
        ok, failures, received = collect_replies(replies, node_ids, timeout_s=deadline_s, labels=self.labels)
        for nid in unsent:
            failures[self.labels.get(nid, f"node-{nid}")] = "could not be sent its message (the grid refused it)"
        for nid, after in offline.items():
            failures[self.labels.get(nid, f"node-{nid}")] = (f"went offline (missed heartbeats) {after:.0f} s "
                                                            "into the round, without a reply")
        for nid, o in sorted(self.outstanding.items()):
            if o.round_index != t:
                who = self.labels.get(nid, f"node-{nid}")
                failures[who] = (f"is still busy with round {o.round_index} (no reply for "
                                 f"{time.monotonic() - o.sent:.0f} s); not asked")
        sent_bytes = sum(record_nbytes(recs[nid]) + extras_bytes for nid in node_ids)
        return Answers(replies=ok, failures=failures, asked=len(node_ids), wire_bytes=sent_bytes + received)


__all__ = ["GridAsk", "Outstanding", "global_for", "wait_for_nodes", "collect_replies", "raise_if_fail_closed",
           "error_reason_label", "learn_silo"]
