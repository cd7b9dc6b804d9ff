"""The participant's ClientApp: one "train" message in, one guarded reply out.

Per message: read the node's identity from ``context.node_config`` (``partition-id``, optional
``data-path`` and ``state-dir``), decode the global arrays, the round config and the optional
public ``extras`` arrays, rebuild the run's config from the round config's ``config-json`` (so a
SuperNode needs no config files of its own), call the participant function
(:func:`~lensemble.federation.participant.participant_round` unless a test passes another), and
reply with only ``delta``, ``probe`` and ``metrics``
(:func:`~lensemble.federation.flower.records.reply_to_content` enforces that).

Any exception, ResidencyViolation included, becomes a Flower error reply; the coordinator counts
it as a failure for this round (a fail-closed one stops the run). Only the exception's class and
code leave the node: its message can hold private values, so it is logged here, at the site, and
re-raised as the same class with a message that names nothing but the class
(:func:`sanitised`). Under ``federation.secure_aggregation`` the app answers the SecAgg+ stages
through Flower's ``secaggplus_mod`` (:mod:`lensemble.federation.flower.secagg`): the handler then
returns the checked update (in the pooled objective's summary ask: the checked, scaled summary,
:func:`~lensemble.federation.pooling.secure_summary_payload`) in Flower's FitRes layout, and only
its masked form leaves. With privacy on, the reply must also pass
:func:`~lensemble.federation.validation.check_private_egress`. Flower's CLI loads the module-level
``app``; Python launchers call :func:`make_client_app` with the run configuration baked in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from lensemble.config.schema import LensembleConfig, validate_config
from lensemble.errors import ConfigError, LensembleError, ParticipantFailed, ResidencyViolation
from lensemble.federation.flower import merge_run_config
from lensemble.federation.flower.records import (
    ARRAYS,
    CONFIG,
    EXTRAS,
    record_to_arrays,
    record_to_config,
    reply_to_content,
)
from lensemble.federation.flower.secagg import (
    federated_numel,
    is_secure_message,
    secure_aggregation_mod,
    secure_reply_content,
)
from lensemble.federation.messages import NodeSpec
from lensemble.federation.participant import participant_round, round_global
from lensemble.federation.pooling import is_summary_round, summary_numel, summary_phase
from lensemble.federation.pooling import secure_settings as secure_summary_settings
from lensemble.federation.robust import secure_update_settings
from lensemble.federation.state import federated_keys
from lensemble.federation.validation import check_private_egress

log = logging.getLogger(__name__)

PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
DATA_PATH = "data-path"
STATE_DIR = "state-dir"


def _single_thread() -> None:
    # Virtual clients get one CPU each (Ray num_cpus=1); more intra-op threads only fight.
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def config_from_round(round_config: Mapping[str, Any]) -> LensembleConfig:
    """The run's validated config, carried as JSON in the round config (key ``config-json``)."""
    blob = round_config.get("config-json")
    if not isinstance(blob, str) or not blob:
        raise ConfigError("the round config carries no 'config-json'",
                          remediation="the coordinator must put the resolved config in round_config()")
    return validate_config(json.loads(blob))


def default_state_dir(cfg: LensembleConfig, run_config: Mapping[str, Any], run_id: str | None = None) -> Path:
    """Where participants keep local state when the node config names no ``state-dir``.

    ``node-state-dir`` baked in by a Python launcher (simulation: the coordinator's
    ``<run>/nodes``), else ``federation.state_dir``, else
    ``~/.cache/lensemble/state/<config hash>[-<run id>]`` on the node's own disk (the run id, sent
    by the coordinator, keeps two runs of one config apart). The participant adds a
    per-participant folder below it.
    """
    if run_config.get("node-state-dir"):
        return Path(str(run_config["node-state-dir"]))
    if cfg.federation.state_dir:
        return Path(cfg.federation.state_dir)
    name = cfg.config_hash()[:12] + (f"-{str(run_id)[:12]}" if run_id else "")
    return Path.home() / ".cache" / "lensemble" / "state" / name


def node_spec(context: Context, cfg: LensembleConfig, run_config: Mapping[str, Any],
              run_id: str | None = None) -> NodeSpec:
    """This node's ``NodeSpec`` from its node config (see :func:`default_state_dir`)."""
    nc = context.node_config
    if PARTITION_ID not in nc:
        raise ConfigError("this node has no 'partition-id' in its node config",
                          remediation="start the SuperNode with --node-config 'partition-id=N'")
    try:
        pid = int(nc[PARTITION_ID])
    except (TypeError, ValueError):
        raise ConfigError(f"partition-id must be an integer, got {nc[PARTITION_ID]!r}",
                          remediation="use --node-config 'partition-id=0'") from None
    if not 0 <= pid < cfg.data.num_silos:
        raise ConfigError(f"partition-id {pid} is outside [0, data.num_silos={cfg.data.num_silos})",
                          remediation="give each site a distinct partition-id below data.num_silos")
    if nc.get(NUM_PARTITIONS) not in (None, "") and int(nc[NUM_PARTITIONS]) != cfg.data.num_silos:
        raise ConfigError(f"this node says num-partitions={nc[NUM_PARTITIONS]} but the run has "
                          f"data.num_silos={cfg.data.num_silos}",
                          remediation="fix the node's --node-config or the run's data.num_silos")
    data_path = str(nc[DATA_PATH]) if nc.get(DATA_PATH) else None
    state_dir = Path(str(nc[STATE_DIR])) if nc.get(STATE_DIR) else default_state_dir(cfg, run_config, run_id)
    state_dir.mkdir(parents=True, exist_ok=True)
    return NodeSpec(partition_id=pid, data_path=data_path, state_dir=str(state_dir))


MARKER = "lensemble-error:"


SILO_MARKER = "lensemble-silo:"


def sanitised(exc: BaseException, silo: int | None = None) -> LensembleError:
    """``exc`` as it may leave the node: the same Lensemble class (so a fail-closed error still
    stops the run) or :class:`~lensemble.errors.ParticipantFailed` for any other exception, whose
    message is only a marker naming the class (``lensemble-error:RoundError``,
    ``lensemble-error:ParticipantFailed:KeyError``) and the class's default remediation. The
    server reads the marker wherever the runtime embeds the message
    (:func:`~lensemble.federation.flower.transport.error_reason_label`). ``silo`` (the node's
    partition id, public run metadata) is appended as ``lensemble-silo:<i>``, so a node that fails
    before it ever replied is reported as ``silo-<i>``, not by its Flower node id."""
    where = f" {SILO_MARKER}{silo}" if silo is not None else ""
    if isinstance(exc, LensembleError):
        try:
            return type(exc)(f"{MARKER}{type(exc).__name__}{where}")
        except TypeError:  # a subclass with its own constructor
            pass
    return ParticipantFailed(f"{MARKER}ParticipantFailed:{type(exc).__name__}{where}")


def partition_of(context: Context) -> int | None:
    """This node's partition id from its node config, or None when it has none usable."""
    try:
        return int(context.node_config[PARTITION_ID])
    except (KeyError, TypeError, ValueError):
        return None


def handle_train(msg: Message, context: Context, participant: Callable = participant_round,
                 baked: Mapping[str, Any] | None = None, *, federated: Callable = federated_keys) -> Message:
    """One participant round for one "train" message; returns the guarded reply.

    Raises only :func:`sanitised` errors (the full one is logged on this node).
    """
    try:
        return _handle_train(msg, context, participant, baked, federated)
    except Exception as exc:
        log.error("participant round failed on this node", exc_info=True)  # stays at the site
        raise sanitised(exc, partition_of(context)) from None


def _handle_train(msg: Message, context: Context, participant: Callable,
                  baked: Mapping[str, Any] | None, federated: Callable) -> Message:
    _single_thread()
    run_config = merge_run_config(context.run_config, baked)
    global_arrays = record_to_arrays(msg.content[ARRAYS])
    round_config = record_to_config(msg.content[CONFIG])
    cfg = config_from_round(round_config)
    node = node_spec(context, cfg, run_config, run_id=round_config.get("run-id"))
    extras = record_to_arrays(msg.content[EXTRAS]) if EXTRAS in msg.content else None  # e.g. anchor targets
    secure = is_secure_message(msg)
    if cfg.federation.secure_aggregation and not secure:
        # the run promised the participants that only a masked update leaves: refuse a plain ask
        raise ResidencyViolation("federation.secure_aggregation is on but this 'train' message is not "
                                 "part of a SecAgg+ round; the update would leave unmasked",
                                 remediation="the coordinator must run the SecAgg+ stages (SecureGridAsk)")
    # a train ask after the summary ask may carry no global, only its digest: the one kept then
    global_arrays = round_global(node, round_config, global_arrays)
    reply = participant(cfg, node, global_arrays, round_config, extras)
    if cfg.privacy.enabled:  # whatever participant function ran, the DP egress rule holds here
        check_private_egress({"probe_embeddings": reply.probe_embeddings, "metrics": reply.metrics})
    if secure:  # [secagg] checked here, then masked by secure_aggregation_mod around this handler
        if is_summary_round(round_config):  # the pooled objective's summary: its own size and bounds
            numel, settings = summary_numel(cfg, summary_phase(round_config)), secure_summary_settings(cfg)
        else:
            keys = federated(cfg)
            params = {k: a for k, a in global_arrays.items() if k in keys and a.dtype.kind == "f"}
            # B: the run's step bound from this global, as the coordinator computes it (federation/robust.py)
            numel, settings = federated_numel(global_arrays, keys), secure_update_settings(cfg, params)
        content = secure_reply_content(reply, partition_id=node.partition_id, numel=numel, settings=settings)
        return Message(content, reply_to=msg)
    return Message(reply_to_content(reply, partition_id=node.partition_id), reply_to=msg)


def make_client_app(participant: Callable = participant_round, *,
                    run_config: Mapping[str, Any] | None = None,
                    federated: Callable = federated_keys) -> ClientApp:
    """A ClientApp that answers "train" with ``participant(cfg, node, global, round_config, extras)``.

    ``run_config`` is laid over ``context.run_config``; ``federated(cfg)`` names the tensors a
    pseudo-gradient covers (the size a secure participant checks its update against).
    """
    baked = dict(run_config or {})
    # [secagg] Flower's secaggplus_mod for SecAgg+ messages; plain "train" messages pass untouched
    client = ClientApp(mods=[secure_aggregation_mod])

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        return handle_train(msg, context, participant, baked, federated=federated)

    return client


app = make_client_app()

__all__ = ["app", "make_client_app", "handle_train", "node_spec", "default_state_dir", "config_from_round",
           "sanitised", "partition_of", "MARKER", "SILO_MARKER"]
