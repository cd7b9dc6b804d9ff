"""Conversions between Lensemble's plain values and Flower records.

Everything that crosses the wire goes through this file, so it is also where the two boundary
checks live:

- :func:`reply_to_content` (participant side) is the egress guard of the Flower adapter. A reply
  may leave a silo only as three records: ``"delta"`` (ArrayRecord: the codec payload of the
  pseudo-gradient), ``"probe"`` (ArrayRecord with one array ``"embeddings"``: the participant's
  embeddings of the PUBLIC probe) and ``"metrics"`` (MetricRecord: numeric scalars). Anything else
  raises :class:`~lensemble.errors.ResidencyViolation` before a byte is sent.
- :func:`content_to_reply` (server side) refuses replies carrying records outside that list, so a
  misbehaving participant cannot smuggle data into the coordinator's run folder either.

Arrays are ``dict[str, np.ndarray]``; a Flower ``Array`` stores each one as ``np.save`` bytes
(``allow_pickle=False``), and :func:`record_nbytes` counts exactly those bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from lensemble.errors import ResidencyViolation
from lensemble.federation.messages import Reply
from lensemble.federation.validation import check_egress

log = logging.getLogger(__name__)
_warned_string_metrics: set[str] = set()

# Names of the records in a "train" instruction (server -> participant). EXTRAS (optional) carries
# public side inputs from the coordinator, e.g. the anchor targets on the public probe.
ARRAYS = "arrays"
CONFIG = "config"
EXTRAS = "extras"
# Names of the records a participant may send back; nothing else is allowed.
DELTA = "delta"
PROBE = "probe"
METRICS = "metrics"
REPLY_RECORDS = frozenset({DELTA, PROBE, METRICS})
PROBE_ARRAY = "embeddings"
# Bookkeeping scalars the adapter adds to the metrics record. Participants may not use the prefix.
RESERVED_PREFIX = "lensemble/"
ROUND_KEY = RESERVED_PREFIX + "round-index"
PARTITION_KEY = RESERVED_PREFIX + "partition-id"
# Fields a Reply may have; an object with more is refused (the allow-list covers the Python side too).
REPLY_FIELDS = frozenset({"round_index", "payload", "probe_embeddings", "metrics"})


# ---------------------------------------------------------------------------------------------
# arrays


def _as_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        arr = value.detach().cpu().numpy()
    else:
        raise TypeError(f"array {name!r} is a {type(value).__name__}, expected a numpy array")
    if arr.dtype == object:
        raise TypeError(f"array {name!r} has dtype object, which cannot be sent")
    return np.ascontiguousarray(arr)


def arrays_to_record(arrays: Mapping[str, Any]) -> ArrayRecord:
    """``dict[str, np.ndarray]`` (torch tensors accepted) -> ArrayRecord, keys in sorted order."""
    rec = ArrayRecord()
    for name in sorted(arrays):
        rec[str(name)] = Array(_as_numpy(name, arrays[name]))
    return rec


def record_to_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord -> ``dict[str, np.ndarray]`` (fresh, writable arrays)."""
    return {name: np.array(arr.numpy(), copy=True) for name, arr in record.items()}


def record_nbytes(record: ArrayRecord) -> int:
    """Bytes of serialised array data in ``record`` (the ``np.save`` bytes each Array carries)."""
    return sum(len(arr.data) for arr in record.values())


def copy_record(record: ArrayRecord) -> ArrayRecord:
    """A new ArrayRecord sharing the (immutable) serialised bytes: one per outgoing message."""
    return ArrayRecord({name: Array(arr.dtype, tuple(arr.shape), arr.stype, arr.data)
                        for name, arr in record.items()})


# ---------------------------------------------------------------------------------------------
# config and metrics


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def config_to_record(config: Mapping[str, Any]) -> ConfigRecord:
    """A flat dict of int / float / str / bool / bytes -> ConfigRecord (numpy scalars unwrapped)."""
    rec = ConfigRecord()
    for key, value in config.items():
        value = _scalar(value)
        if not isinstance(value, (int, float, str, bool, bytes)):
            raise TypeError(f"config value {key!r} is a {type(value).__name__}; "
                            "only int, float, str, bool and bytes can travel in a ConfigRecord")
        rec[str(key)] = value
    return rec


def record_to_config(record: ConfigRecord) -> dict[str, Any]:
    """ConfigRecord -> plain dict."""
    return dict(record.items())


def metrics_to_record(metrics: Mapping[str, Any]) -> MetricRecord:
    """Scalar metrics -> MetricRecord.

    MetricRecords hold only int and float: bools become 0/1, and string metrics are not sent (a
    free-form string is the easiest way for private data to leak, e.g. a file path), with a
    warning naming the key. Non-finite floats are sent as they are; the coordinator judges them.
    """
    rec = MetricRecord()
    for key, value in metrics.items():
        value = _scalar(value)
        if isinstance(value, bool):
            rec[key] = int(value)
        elif isinstance(value, (int, float)):
            rec[key] = value
        elif isinstance(value, str):
            if key not in _warned_string_metrics:  # once per key, not once per round
                _warned_string_metrics.add(key)
                log.warning("metric %r is a string and stays on the participant", key)
        else:
            raise ResidencyViolation(f"metric {key!r} is a {type(value).__name__}; only scalars may leave")
    return rec


# ---------------------------------------------------------------------------------------------
# replies


def _reply_fields(reply: Any) -> set[str]:
    if dataclasses.is_dataclass(reply) and not isinstance(reply, type):
        return {f.name for f in dataclasses.fields(reply)}
    return set(vars(reply))


def reply_to_content(reply: Any, *, partition_id: int) -> RecordDict:
    """Participant side: a ``Reply`` -> the RecordDict sent back, after the egress guard.

    Raises ResidencyViolation when the reply has fields outside (round_index, payload,
    probe_embeddings, metrics), when :func:`lensemble.federation.validation.check_egress` refuses
    it, or when a metric name uses the adapter's reserved prefix.
    """
    extra = sorted(_reply_fields(reply) - REPLY_FIELDS)
    if extra:
        raise ResidencyViolation(f"reply carries fields outside the egress allow-list: {extra}")
    check_egress({"delta": reply.payload, "probe_embeddings": reply.probe_embeddings,
                  "metrics": reply.metrics})
    clash = sorted(k for k in reply.metrics if str(k).startswith(RESERVED_PREFIX))
    if clash:
        raise ResidencyViolation(f"metric names {clash} use the reserved prefix {RESERVED_PREFIX!r}")

    metrics = metrics_to_record(reply.metrics)
    metrics[ROUND_KEY] = int(reply.round_index)
    metrics[PARTITION_KEY] = int(partition_id)
    probe = _as_numpy("probe_embeddings", reply.probe_embeddings)
    content = RecordDict({
        DELTA: arrays_to_record(reply.payload),
        PROBE: ArrayRecord({PROBE_ARRAY: Array(probe)}),
        METRICS: metrics,
    })
    check_reply_content(content)  # the adapter's own last look at what is about to leave
    return content


def check_reply_content(content: RecordDict) -> None:
    """Raise ResidencyViolation unless ``content`` is exactly the three allowed records."""
    names = set(content.keys())
    if names != REPLY_RECORDS:
        raise ResidencyViolation(
            f"reply records must be exactly {sorted(REPLY_RECORDS)}, got {sorted(names)}")
    kinds = {DELTA: ArrayRecord, PROBE: ArrayRecord, METRICS: MetricRecord}
    for name, kind in kinds.items():
        if not isinstance(content[name], kind):
            raise ResidencyViolation(f"reply record {name!r} must be a {kind.__name__}, "
                                     f"got {type(content[name]).__name__}")
    if set(content[PROBE].keys()) != {PROBE_ARRAY}:
        raise ResidencyViolation(f"reply record 'probe' must hold exactly one array {PROBE_ARRAY!r}")


def content_to_reply(content: RecordDict, reply_cls: type = Reply) -> tuple[Any, int]:
    """Server side: a reply's RecordDict -> ``(reply_cls(...), partition_id)`` (default: a Reply).

    Raises ResidencyViolation for records outside the allow-list and ValueError when the
    bookkeeping scalars are missing; the server turns either into a failure for that participant.
    """
    check_reply_content(content)
    metrics = dict(content[METRICS].items())
    try:
        round_index = int(metrics.pop(ROUND_KEY))
        partition_id = int(metrics.pop(PARTITION_KEY))
    except KeyError as exc:
        raise ValueError(f"reply lacks the bookkeeping metric {exc.args[0]!r}") from None
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            log.warning("metric %r from partition %d is %r", key, partition_id, value)
    reply = reply_cls(
        round_index=round_index,
        payload=record_to_arrays(content[DELTA]),
        probe_embeddings=np.array(content[PROBE][PROBE_ARRAY].numpy(), copy=True),
        metrics=metrics,
    )
    return reply, partition_id


def reply_nbytes(content: RecordDict) -> int:
    """Serialised array bytes in a reply (every ArrayRecord it holds)."""
    return sum(record_nbytes(rec) for rec in content.values() if isinstance(rec, ArrayRecord))


__all__ = [
    "ARRAYS", "CONFIG", "EXTRAS", "DELTA", "PROBE", "METRICS", "REPLY_RECORDS", "PROBE_ARRAY",
    "ROUND_KEY", "PARTITION_KEY",
    "arrays_to_record", "record_to_arrays", "record_nbytes", "copy_record",
    "config_to_record", "record_to_config", "metrics_to_record",
    "reply_to_content", "check_reply_content", "content_to_reply", "reply_nbytes",
]
