"""An in-process Flower Grid: the real ServerApp and ClientApp objects, no Ray, no sockets.

For tests and CI on small machines. Each virtual node has its own ``Context`` (``node_config``
with ``partition-id`` and ``num-partitions`` like Flower's simulation engine, plus any extra keys
such as ``data-path``) and its own ``context.state`` that persists across rounds. Each node has
its own daemon worker thread and handles one message at a time, like a SuperNode, so a hung node
never delays another node's messages and never keeps the process alive after the run;
``send_and_receive(timeout=...)`` returns on time while a slow node is still working, and its late
reply is dropped, as a SuperLink would. A message pushed with :meth:`push_messages` stays
pullable until its reply has been pulled, so a caller can learn when a late node is free. Every message
crosses a protobuf round trip in each direction, so content that could not travel over a real
link fails here too. An exception in the ClientApp becomes an error reply in the same format as
Flower's runtimes (``"<class 'X'>:<'message'>"``).

Flower internals used (1.42.0), all confined to this file:

- ``flwr.supercore.task_identity.TaskIdentity``: ``Message(content, dst, type)`` reads the run,
  node and task ids of "the current process" from it. The grid sets them while it is open and
  restores the previous values on :meth:`LocalGrid.close`.
- ``flwr.common.serde.message_to_proto`` / ``message_from_proto``: the wire copy.
- ``Message.metadata.__dict__["_message_id"]``: message ids are normally assigned by the SuperLink;
  ``InMemoryGrid`` and the simulation engine set them the same way.
- ``flwr.supercore.run.Run.create_empty`` for the ``Grid.run`` property.
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

POLL_S = 0.01


def _wire_copy(msg: Message) -> Message:
    return message_from_proto(message_to_proto(msg))


def _set_id(msg: Message) -> str:
    mid = str(uuid4())
    msg.metadata.__dict__["_message_id"] = mid
    return mid


class LocalGrid(Grid):
    """A Grid whose nodes are ``client_app`` called on worker threads of this process.

    ``num_nodes`` virtual nodes get partition ids 0..num_nodes-1; ``node_configs`` (one mapping
    per node) adds or overrides node-config keys; ``run_config`` becomes every ClientApp's
    ``context.run_config``. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, client_app: ClientApp, num_nodes: int, *,
                 node_configs: list[Mapping[str, Any]] | None = None,
                 run_config: Mapping[str, Any] | None = None,
                 seed: int = 0) -> None:
        if num_nodes < 1:
            raise ValueError("num_nodes must be >= 1")
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError("node_configs needs one mapping per node")
        rng = random.Random(seed)
        self.client_app = client_app
        self.run_config = dict(run_config or {})
        self._run = Run.create_empty(run_id=rng.getrandbits(63))
        self._node_ids = [rng.getrandbits(63) for _ in range(num_nodes)]
        self.contexts: dict[int, Context] = {}
        for i, nid in enumerate(self._node_ids):
            node_config = {"partition-id": i, "num-partitions": num_nodes}
            node_config.update(dict(node_configs[i]) if node_configs else {})
            self.contexts[nid] = Context(run_id=self._run.run_id, node_id=nid, node_config=node_config,
                                         state=RecordDict(), run_config=dict(self.run_config))
        self.offline: set[int] = set()  # tests may take nodes offline
        # One inbox and one daemon thread per node: a node runs one message at a time, and a
        # node stuck in its ClientApp blocks only itself (daemon: never the interpreter's exit).
        self._inbox: dict[int, queue.Queue] = {nid: queue.Queue() for nid in self._node_ids}
        self._workers = {nid: threading.Thread(target=self._serve, args=(nid,), daemon=True,
                                               name=f"lensemble-node-{i}")
                         for i, nid in enumerate(self._node_ids)}
        self.pull_interval = POLL_S
        self._lock = threading.Condition()
        self._awaited: set[str] = set()
        self._replies: dict[str, Message] = {}
        self._task_ids = itertools.count(1)
        self._saved_identity = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id = self._run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        TaskIdentity.task_id = next(self._task_ids)
        self._closed = False
        for worker in self._workers.values():
            worker.start()

    # --- Grid API -----------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return [nid for nid in self._node_ids if nid not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            nid = msg.metadata.dst_node_id
            if nid not in self.contexts:
                raise ValueError(f"unknown destination node {nid}")
            wire = _wire_copy(msg)
            mid = _set_id(wire)
            with self._lock:
                if self._closed:
                    raise RuntimeError("the grid is closed")
                self._awaited.add(mid)
            self._inbox[nid].put(wire)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        with self._lock:
            out = [self._replies.pop(mid) for mid in list(message_ids) if mid in self._replies]
            for msg in out:
                self._awaited.discard(msg.metadata.reply_to_message_id)
        return out

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        pending = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        got: list[Message] = []
        while pending:
            with self._lock:
                if not any(mid in self._replies for mid in pending):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._lock.wait(timeout=left)
            new = list(self.pull_messages(pending))
            got.extend(new)
            pending -= {m.metadata.reply_to_message_id for m in new}
        with self._lock:  # give up on the rest: their replies will be dropped on arrival
            self._awaited -= pending
        return got

    # --- node side ----------------------------------------------------------------------------
    def _serve(self, nid: int) -> None:
        inbox = self._inbox[nid]
        while True:
            msg = inbox.get()
            if msg is None or self._closed:
                return
            self._deliver(msg)

    def _deliver(self, msg: Message) -> None:
        nid = msg.metadata.dst_node_id
        # runs on the node's own thread: one message at a time, like a SuperNode
        with self._lock:
            abandoned = self._closed or msg.metadata.message_id not in self._awaited
        if abandoned:
            return
        if nid in self.offline:
            return  # an offline node never answers
        if time.time() > msg.metadata.created_at + msg.metadata.ttl:
            reply = Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="message expired"),
                            reply_to=msg)
        else:
            try:
                reply = self.client_app(message=msg, context=self.contexts[nid])
            except Exception as exc:  # the ClientApp runtimes report, never raise
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{type(exc)}:<'{exc}'>"), reply_to=msg)
        try:
            wire = _wire_copy(reply)
        except Exception as exc:
            wire = _wire_copy(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                            reason=f"reply cannot be serialised: {exc}"),
                                      reply_to=msg))
        _set_id(wire)
        with self._lock:
            if msg.metadata.message_id in self._awaited:
                self._replies[msg.metadata.message_id] = wire
                self._lock.notify_all()

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop delivering, do not wait for running ClientApps, restore TaskIdentity.

        Idle node threads end at once; a node stuck in its ClientApp ends when that returns (it
        is a daemon thread, so it never holds the process open).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        for inbox in self._inbox.values():
            inbox.put(None)
        (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id) = self._saved_identity

    def alive_threads(self) -> list[threading.Thread]:
        """Node threads still running (a hung ClientApp's, after close)."""
        return [w for w in self._workers.values() if w.is_alive()]

    def __enter__(self) -> LocalGrid:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_on_local_grid(server_app: ServerApp, client_app: ClientApp, num_nodes: int, *,
                  run_config: Mapping[str, Any] | None = None,
                  node_configs: list[Mapping[str, Any]] | None = None,
                  grid: LocalGrid | None = None) -> Context:
    """Run ``server_app`` against ``num_nodes`` in-process ClientApps; returns the server Context.

    Exceptions from the ServerApp propagate unchanged. Pass ``grid`` to control nodes from a test
    (e.g. take one offline); it is closed either way.
    """
    grid = grid or LocalGrid(client_app, num_nodes, node_configs=node_configs, run_config=run_config)
    context = Context(run_id=grid.run.run_id, node_id=SUPERLINK_NODE_ID, node_config={},
                      state=RecordDict(), run_config=dict(run_config or {}))
    try:
        server_app(grid=grid, context=context)
    finally:
        grid.close()
    return context


__all__ = ["LocalGrid", "serve_on_local_grid"]
