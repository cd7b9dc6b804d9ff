"""Secure aggregation over a Flower Grid: Flower's SecAgg+ under the DiLoCo outer step.

Participant side, :func:`secure_aggregation_mod` (installed on every ClientApp; a no-op for plain
"train" messages): Flower's own ``secaggplus_mod`` runs the four SecAgg+ stages. At "collect
masked vectors" it calls our train handler, which returns the released Δ (flat, float64) in
Flower's legacy FitRes layout after :func:`~lensemble.federation.secure_agg.check_before_masking`;
the mod quantises it, adds the private and pairwise masks and empties every array record. Our
mod holds the public-probe embeddings (``probe``, (|P|, d) or (0, d) under DP) out of the masking
and puts them back, then checks that nothing but the allow-listed records, none holding a
plaintext array, leaves (:func:`check_secure_reply_content`).

Coordinator side, :class:`SecureGridAsk` (the AskFn the ServerApp uses under
``federation.secure_aggregation``): Flower's ``SecAggPlusWorkflow`` stage by stage
(setup, share keys, collect masked vectors, unmask) over the grid, with every participant holding
a share for every other (all-to-all, ``num_shares=1.0``), threshold ``federation.secagg_threshold``,
weights 1 (``max_weight=1``, ``num_examples=1``: DiLoCo's unweighted mean), coordinate range
``secagg_clip_range`` quantised to ``2^secagg_bits`` levels, modulus 2^32. The workflow's strategy
hook only receives the unmasked aggregate; the ask hands the coordinator S = Σ Δ_c
(:class:`~lensemble.federation.secure_agg.SecureSum`) and per-participant replies that carry no
update, only the probe embeddings and the scalar metrics. The pooled objective's summary ask
(round config ``phase=summary``, :mod:`lensemble.federation.pooling`) runs the same four stages:
the handler returns the participant's summary, scaled and range-checked, with the summary
template's size (``summary_numel``) instead of the model's (:func:`federated_numel`), and the
coordinator receives the sum of the summaries.

Flower 1.42 internals used, all confined to this file: ``SecAggPlusWorkflow``'s public stage
methods and its ``WorkflowState``; a ``LegacyContext`` with a small ``Strategy`` whose
``configure_fit`` names the nodes and whose ``aggregate_fit`` captures the aggregate. Between
stages the sample is narrowed to the nodes that completed the previous one: Flower counts a node
that left before sharing its keys as "dead" and would ask the others for shares they never got,
failing the round; such a node took no part in any mask, so dropping it is exact. Dropouts
*after* sharing keys are Flower's own recovery (their pairwise masks are rebuilt from t shares).

Caveat (Flower 1.42): the mask generator seeds numpy's MT19937 with 32 bits folded from each
256-bit shared secret (``secaggplus_utils.pseudo_rand_gen``), so a server willing to search 2^32
seeds per mask could strip it. This protects against an honest-but-curious coordinator, not a
determined one (docs/federation.md, "Secure aggregation").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow, WorkflowState
from flwr.serverapp import Grid

from lensemble.config.schema import LensembleConfig
from lensemble.errors import LensembleError, ResidencyViolation, RoundError, SecureAggregationAborted
from lensemble.federation import codec
from lensemble.federation.flower.records import (
    ARRAYS,
    CONFIG,
    EXTRAS,
    PARTITION_KEY,
    PROBE,
    PROBE_ARRAY,
    RESERVED_PREFIX,
    ROUND_KEY,
    arrays_to_record,
    config_to_record,
    copy_record,
    metrics_to_record,
    record_nbytes,
)
from lensemble.federation.flower.transport import (
    PULL_S,
    TTL_MARGIN_S,
    GridAsk,
    Outstanding,
    error_reason_label,
    global_for,
    learn_silo,
    raise_if_fail_closed,
    wait_for_nodes,
)
from lensemble.federation.messages import Reply, participant_id
from lensemble.federation.rounds import Answers
from lensemble.federation.secure_agg import SecAggSettings, SecureSum, check_before_masking
from lensemble.federation.validation import check_egress

log = logging.getLogger(__name__)

# Flower's legacy FitRes layout, which secaggplus_mod reads and the workflow parses.
FITRES_PARAMETERS = "fitres.parameters"
FITRES_NUM_EXAMPLES = "fitres.num_examples"
FITRES_METRICS = "fitres.metrics"
FITRES_STATUS = "fitres.status"
#: What a participant may send back at the "collect masked vectors" stage; the masked vector is in
#: the SecAgg+ config record, every ArrayRecord but ``probe`` must be empty.
SECURE_REPLY_RECORDS = frozenset({FITRES_PARAMETERS, FITRES_NUM_EXAMPLES, FITRES_METRICS, FITRES_STATUS,
                                  PROBE, RECORD_KEY_CONFIGS})
#: What it may send at the other three stages (public keys, encrypted shares, shares).
SECURE_STAGE_RECORDS = frozenset({RECORD_KEY_CONFIGS})
STAGES = ("setup", "share keys", "collect masked vectors", "unmask")


def is_secure_message(msg: Message) -> bool:
    """A "train" message that is part of a SecAgg+ round (it carries the SecAgg+ config record)."""
    return msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records


# ---------------------------------------------------------------------------------------------
# participant side


def federated_numel(global_arrays: dict[str, np.ndarray], keys: Iterable[str]) -> int:
    """n: coordinates of Δ, the floating global tensors named in ``keys`` (federation.state)."""
    wanted = set(keys)
    return int(sum(a.size for k, a in global_arrays.items() if k in wanted and a.dtype.kind == "f"))


def secure_reply_content(reply: Any, *, partition_id: int, numel: int, settings: SecAggSettings) -> RecordDict:
    """Participant side: a Reply -> the FitRes-layout content secaggplus_mod masks.

    The reply passes the egress guard first, then the released Δ (decoded from its codec form,
    exactly what the server would have decoded) passes :func:`check_before_masking`. Δ travels
    into the mod as float64 (Flower quantises ``(Δ + c)·2^b/2c``: in float32 that product would
    lose up to one level). Weight 1 (``num_examples``) for everyone.
    """
    check_egress({"delta": reply.payload, "probe_embeddings": reply.probe_embeddings, "metrics": reply.metrics})
    clash = sorted(k for k in reply.metrics if str(k).startswith(RESERVED_PREFIX))
    if clash:
        raise ResidencyViolation(f"metric names {clash} use the reserved prefix {RESERVED_PREFIX!r}")
    flat = codec.payload_flat(reply.payload)
    check_before_masking(flat, numel, settings)
    metrics = dict(metrics_to_record(reply.metrics).items())
    metrics[ROUND_KEY] = int(reply.round_index)
    metrics[PARTITION_KEY] = int(partition_id)
    fitres = FitRes(status=Status(Code.OK, ""), parameters=ndarrays_to_parameters([flat.astype(np.float64)]),
                    num_examples=1, metrics=metrics)
    content = compat.fitres_to_recorddict(fitres, keep_input=False)
    probe = np.ascontiguousarray(np.asarray(reply.probe_embeddings, dtype=np.float32))
    content[PROBE] = ArrayRecord({PROBE_ARRAY: Array(probe)})
    return content


def check_secure_reply_content(content: RecordDict) -> None:
    """ResidencyViolation unless ``content`` is a SecAgg+ stage reply with no plaintext array.

    Allowed: the SecAgg+ config record alone (setup, share keys, unmask), or at "collect masked
    vectors" the FitRes records with every ArrayRecord empty except ``probe``.
    """
    names = set(content.keys())
    if names != SECURE_STAGE_RECORDS and names != SECURE_REPLY_RECORDS:
        raise ResidencyViolation(f"a SecAgg+ reply may hold {sorted(SECURE_STAGE_RECORDS)} or "
                                 f"{sorted(SECURE_REPLY_RECORDS)}, got {sorted(names)}")
    for name, rec in content.array_records.items():
        if name == PROBE:
            if set(rec.keys()) != {PROBE_ARRAY}:
                raise ResidencyViolation(f"reply record 'probe' must hold exactly one array {PROBE_ARRAY!r}")
        elif len(rec):
            raise ResidencyViolation(f"reply record {name!r} still holds {len(rec)} plaintext array(s) "
                                     "after SecAgg+ masking")


def secure_aggregation_mod(msg: Message, ctxt: Context, call_next: Callable) -> Message:
    """ClientApp mod: Flower's ``secaggplus_mod`` for SecAgg+ messages, a pass-through otherwise.

    Errors leave the node sanitised (class and code only), like the train handler's own.
    """
    if not is_secure_message(msg):
        return call_next(msg, ctxt)
    from lensemble.federation.flower.client_app import partition_of, sanitised  # that module imports this one

    held: dict[str, ArrayRecord] = {}

    def train_and_hold_probe(m: Message, c: Context) -> Message:
        out = call_next(m, c)
        if not out.has_error() and PROBE in out.content.array_records:
            # public-probe embeddings are not the update: they bypass the masking (and the mod's
            # clearing of every array record) and are put back below
            held[PROBE] = out.content.array_records.pop(PROBE)
        return out

    try:
        reply = secaggplus_mod(msg, ctxt, train_and_hold_probe)
        if PROBE in held:
            reply.content[PROBE] = held[PROBE]
        check_secure_reply_content(reply.content)
    except Exception as exc:
        log.error("SecAgg+ stage failed on this node", exc_info=True)  # stays at the site
        raise sanitised(exc, partition_of(ctxt)) from None
    return reply


# ---------------------------------------------------------------------------------------------
# coordinator side


def content_to_secure_reply(content: RecordDict) -> tuple[Reply, int]:
    """Server side: a "collect masked vectors" reply -> (Reply with no update, partition id).

    The Reply's payload is empty: the masked vector stays in the SecAgg+ records, the
    coordinator never receives an individual update.
    """
    check_secure_reply_content(content)
    if set(content.keys()) != SECURE_REPLY_RECORDS:
        raise ValueError("not a 'collect masked vectors' reply")
    metrics = dict(content.config_records[FITRES_METRICS].items())
    try:
        round_index = int(metrics.pop(ROUND_KEY))
        partition = int(metrics.pop(PARTITION_KEY))
    except KeyError as exc:
        raise ValueError(f"reply lacks the bookkeeping metric {exc.args[0]!r}") from None
    probe = np.array(content[PROBE][PROBE_ARRAY].numpy(), copy=True)
    return Reply(round_index=round_index, payload={}, probe_embeddings=probe, metrics=metrics), partition


def content_nbytes(content: RecordDict) -> int:
    """Payload bytes of a message: array data plus the bytes values of its config records
    (SecAgg+ keys, encrypted shares and masked vectors travel as bytes there)."""
    total = sum(record_nbytes(r) for r in content.array_records.values())
    for rec in content.config_records.values():
        for value in rec.values():
            if isinstance(value, bytes):
                total += len(value)
            elif isinstance(value, list):
                total += sum(len(v) for v in value if isinstance(v, bytes))
    return total


class _Capture(Strategy):
    """The workflow's Strategy hook: names the round's nodes, captures the unmasked aggregate."""

    def __init__(self, grid: Grid, node_ids: list[int]):
        self.grid = grid
        self.node_ids = list(node_ids)
        self.aggregate: list[np.ndarray] | None = None
        self.contributors: list[int] = []

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        # the FitIns is replaced by Lensemble's own instruction before the collect stage
        empty = FitIns(Parameters(tensors=[], tensor_type=""), {})
        return [(GridClientProxy(nid, self.grid, 0), empty) for nid in self.node_ids]

    def aggregate_fit(self, server_round, results, failures):
        if results:
            self.aggregate = parameters_to_ndarrays(results[0][1].parameters)  # all share the aggregate
            self.contributors = sorted(int(proxy.node_id) for proxy, _ in results)
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class _StageLink:
    """The grid as the workflow's stages see it: ``send_and_receive`` with a TTL, a poll that
    honours ``cancel``, fail-closed participant errors raised, and a record per stage of who was
    asked, who answered, what failed and how many payload bytes moved."""

    def __init__(self, grid: Grid, *, ttl_s: float, cancel: threading.Event | None,
                 labels: dict[int, str], observe: Callable[[str, Message], None] | None = None,
                 unanswered: Callable[[str, int, float], None] | None = None):
        self.grid = grid
        self.unanswered = unanswered
        self.ttl_s = ttl_s
        self.cancel = cancel
        self.labels = labels
        self.observe = observe
        self.poll_s = min(float(getattr(grid, "pull_interval", PULL_S) or PULL_S), PULL_S)
        self.stage = STAGES[0]
        self.asked: dict[str, list[int]] = {}
        self.answered: dict[str, list[Message]] = {}
        self.failed: dict[str, dict[int, str]] = {}
        self.wire_bytes = 0

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        for m in messages:
            m.metadata.ttl = self.ttl_s  # a stale stage message expires instead of running late
        self.wire_bytes += sum(content_nbytes(m.content) for m in messages)
        nodes = [int(m.metadata.dst_node_id) for m in messages]
        ids = [str(i) if i else None for i in self.grid.push_messages(messages)]
        ids += [None] * (len(nodes) - len(ids))
        pending = {mid: nid for mid, nid in zip(ids, nodes, strict=False) if mid}
        failed = {nid: "could not be sent its message" for mid, nid in zip(ids, nodes, strict=False) if not mid}
        got: list[Message] = []
        start = time.monotonic()
        while pending and (timeout is None or time.monotonic() - start < timeout):
            if self.cancel is not None and self.cancel.is_set():
                raise RoundError("the run was cancelled", remediation="start it again to resume")
            for msg in self.grid.pull_messages(list(pending)):
                nid = pending.pop(msg.metadata.reply_to_message_id, None)
                if nid is None:
                    continue
                if msg.has_error():
                    learn_silo(self.labels, nid, msg.error.reason)  # named silo-<i> even before its first reply
                    who = self.labels.get(nid, f"node-{nid}")
                    raise_if_fail_closed(who, msg.error.reason)
                    failed[nid] = f"failed: {error_reason_label(msg.error.reason)} (Flower error {msg.error.code})"
                    continue
                if self.observe is not None:
                    self.observe(self.stage, msg)
                self.wire_bytes += content_nbytes(msg.content)
                got.append(msg)
            if pending:
                left = self.poll_s if timeout is None else max(0.0, timeout - (time.monotonic() - start))
                time.sleep(min(self.poll_s, left))
        for mid, nid in pending.items():
            failed[nid] = f"did not reply within {timeout:g} s"
            if self.unanswered is not None:
                self.unanswered(mid, nid, start)
        self.asked[self.stage] = nodes
        self.answered[self.stage] = got
        self.failed[self.stage] = failed
        return got


@contextlib.contextmanager
def _quiet_flower():
    """Flower's workflow logs its legacy-strategy bookkeeping at INFO ("strategy sampled 2 clients
    (out of 0)"), which reads wrong here; the round line says what happened. Warnings and errors
    still show."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def _narrow(state: WorkflowState) -> None:
    """Keep only the nodes that completed the last stage in the sample and in every neighbourhood
    (see the module docstring: a node that never shared keys is in no mask)."""
    keep = set(state.active_node_ids)
    state.sampled_node_ids = set(keep)
    state.nid_to_neighbours = {n: set(nb) & keep for n, nb in state.nid_to_neighbours.items() if n in keep}


class SecureGridAsk:
    """The AskFn for ``federation.secure_aggregation`` (see the module docstring).

    ``observe(stage, message)``, if given, sees every reply the coordinator receives (tests
    assert on it). Raises :class:`SecureAggregationAborted` when a stage leaves fewer than the
    threshold (nothing is aggregated; the round driver retries per ``federation.round_retries``).
    """

    def __init__(self, grid: Grid, cfg: LensembleConfig, *, cancel: threading.Event | None = None,
                 observe: Callable[[str, Message], None] | None = None):
        self.grid = grid
        self.cfg = cfg
        self.cancel = cancel
        self.observe = observe
        self.settings = SecAggSettings.from_config(cfg.federation)
        self.labels: dict[int, str] = {}  # node id -> participant id, learnt from replies
        # A node that left a stage message unanswered stays busy (and is not asked) until a reply
        # of its own arrives, it leaves the grid, or a deadline after the link expired it: the
        # plain ask's bookkeeping (GridAsk._reap), so a hung site costs one deadline, not one a round.
        self._busy = GridAsk(grid, cfg, cancel=cancel)

    def _workflow(self, deadline_s: float) -> SecAggPlusWorkflow:
        s = self.settings
        return SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=s.threshold, max_weight=1.0,
                                  clipping_range=s.clip_range, quantization_range=s.levels,
                                  modulus_range=s.modulus, timeout=deadline_s)

    def __call__(self, t: int, round_config: dict, global_arrays: dict, extras: dict,
                 deadline_s: float) -> Answers:
        fed = self.cfg.federation
        want = max(fed.min_participants, self.settings.threshold, 2)
        self._busy.cooldown_s = deadline_s
        node_ids = wait_for_nodes(self.grid, want=want, hope=self.cfg.data.num_silos, deadline_s=deadline_s,
                                  busy=self._busy._reap, cancel=self.cancel)

        def unanswered(mid: str, nid: int, sent: float) -> None:
            self._busy.outstanding[nid] = Outstanding(mid, t, sent)

        link = _StageLink(self.grid, ttl_s=deadline_s + TTL_MARGIN_S, cancel=self.cancel, labels=self.labels,
                          observe=self.observe, unanswered=unanswered)
        workflow = self._workflow(deadline_s)
        capture = _Capture(self.grid, node_ids)
        context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                                strategy=capture)
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: int(t)})
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        state = WorkflowState()
        global_rec = arrays_to_record(global_arrays)
        extras_rec = arrays_to_record(extras) if extras else None
        steps = (workflow.setup_stage, workflow.share_keys_stage, workflow.collect_masked_vectors_stage,
                 workflow.unmask_stage)
        counts: list[tuple[str, int]] = []
        for name, step in zip(STAGES, steps, strict=True):
            link.stage = name
            if name == "collect masked vectors":
                # Lensemble's own instruction (global arrays, round config, extras) replaces the
                # legacy FitIns; the workflow adds its SecAgg+ record to it
                state.nid_to_fitins = {nid: _instruction(global_for(self.labels.get(nid), round_config, global_rec),
                                                         round_config, extras_rec)
                                       for nid in state.active_node_ids}
            try:
                with _quiet_flower():
                    ok = step(link, context, state)
            except LensembleError:
                raise
            except Exception as exc:  # Flower's own checks (bad shares, a malformed reply): fail this round
                raise SecureAggregationAborted(
                    f"round {t}: secure aggregation failed at stage '{name}': {type(exc).__name__}: {exc}",
                    accepted=0, min_participants=self.settings.threshold) from exc
            counts.append((name, len(state.active_node_ids)))
            if name == "collect masked vectors":
                self._learn_labels(link)
            if not ok:
                raise SecureAggregationAborted(
                    f"round {t}: secure aggregation stopped at stage '{name}': "
                    f"{len(state.active_node_ids)} of {len(node_ids)} participant(s) left, threshold is "
                    f"{self.settings.threshold} ({self._describe(link)})",
                    accepted=len(state.active_node_ids), min_participants=self.settings.threshold)
            if name in ("setup", "share keys"):
                _narrow(state)
        if capture.aggregate is None or len(capture.contributors) < 2:
            raise SecureAggregationAborted(f"round {t}: secure aggregation produced no sum "
                                           f"({self._describe(link)})",
                                           accepted=len(capture.contributors), min_participants=2)
        replies, failures = self._replies(t, link, node_ids, capture.contributors)
        for nid, o in sorted(self._busy.outstanding.items()):
            if o.round_index != t:
                failures[self.labels.get(nid, f"node-{nid}")] = (
                    f"is still busy with round {o.round_index} (no reply for {time.monotonic() - o.sent:.0f} s); "
                    "not asked")
        # The workflow divides by the total weight C (every weight is 1): S = C · Δ̄.
        total = np.asarray(capture.aggregate[0], dtype=np.float64).reshape(-1) * len(capture.contributors)
        secure = SecureSum(total=total, contributors=tuple(sorted(replies)), stages=tuple(counts))
        return Answers(replies=replies, failures=failures, asked=len(node_ids), wire_bytes=link.wire_bytes,
                       secure_sum=secure)

    def _learn_labels(self, link: _StageLink) -> None:
        for msg in link.answered.get("collect masked vectors", []):
            try:
                _, pid = content_to_secure_reply(msg.content)
            except (LensembleError, ValueError, KeyError, TypeError):
                continue
            self.labels.setdefault(int(msg.metadata.src_node_id), participant_id(pid))

    def _replies(self, t: int, link: _StageLink, node_ids: list[int], contributors: list[int]):
        """Per-contributor replies (no update in them) and every other node's reason."""
        replies: dict[str, Reply] = {}
        failures: dict[str, str] = {}
        for msg in link.answered.get("collect masked vectors", []):
            nid = int(msg.metadata.src_node_id)
            if nid not in contributors:
                continue
            try:
                reply, pid = content_to_secure_reply(msg.content)
            except (LensembleError, ValueError, KeyError, TypeError) as exc:
                # its masked vector is in the sum all the same; only its side data is unusable
                raise RoundError(f"round {t}: node {nid} sent a malformed SecAgg+ reply ({exc})") from None
            key = participant_id(pid)
            if key in replies:
                raise RoundError(f"round {t}: two nodes claim partition-id {pid}",
                                 remediation="give each SuperNode a distinct partition-id")
            replies[key] = reply
        for nid in node_ids:
            who = self.labels.get(nid, f"node-{nid}")
            if nid in contributors:
                if nid in link.failed.get("unmask", {}):
                    failures[who] = f"dropped out at stage 'unmask' after its masked update was summed " \
                                    f"({link.failed['unmask'][nid]})"
                continue
            stage, why = next(((s, link.failed[s][nid]) for s in STAGES if nid in link.failed.get(s, {})),
                              ("collect masked vectors", "was not part of the sum"))
            failures[who] = f"dropped out at stage '{stage}' ({why})"
        return replies, failures

    def _describe(self, link: _StageLink) -> str:
        parts = [f"{self.labels.get(nid, f'node-{nid}')} at '{stage}': {why}"
                 for stage in STAGES for nid, why in sorted(link.failed.get(stage, {}).items())]
        return "; ".join(parts) or "no failures reported"


def _instruction(global_rec: ArrayRecord, round_config: dict, extras_rec: ArrayRecord | None) -> RecordDict:
    content = RecordDict({ARRAYS: copy_record(global_rec), CONFIG: config_to_record(round_config)})
    if extras_rec is not None:
        content[EXTRAS] = copy_record(extras_rec)
    return content


__all__ = ["SecureGridAsk", "secure_aggregation_mod", "secure_reply_content", "check_secure_reply_content",
           "content_to_secure_reply", "content_nbytes", "federated_numel", "is_secure_message",
           "SECURE_REPLY_RECORDS", "SECURE_STAGE_RECORDS", "STAGES"]
