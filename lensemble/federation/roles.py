"""The two federated roles, framework-free: what a participant does in a round and what the
coordinator does with the replies. The Flower apps only move these objects over the wire.

Participant, round t (DESIGN.md §4): load the global weights, run H inner AdamW steps on its own
silo (optimizer state kept on its local disk), then, in this order (INV-ALIGN-BEFORE-RELEASE):
backstop alignment of the full weights and re-difference, clip, DP noise, int8. It replies with
the encoded pseudo-gradient, its (unaligned) embeddings of the public probe, and scalars.

Coordinator, round t: validate replies, require a quorum, average in sorted participant order
in fp64, take the Nesterov outer step, optionally distil the global encoder toward the aligned
consensus (rung 5), measure frame drift on the probe, and commit a hash-chained checkpoint plus
its own state, so a restarted coordinator continues bitwise identically.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from lensemble.artifacts.checkpoint import load_checkpoint, read_header, save_checkpoint
from lensemble.artifacts.manifest import build_manifest, write_manifest
from lensemble.config.schema import LensembleConfig, validate_config
from lensemble.config.seeds import derive, torch_generator
from lensemble.data.clips import ClipSampler
from lensemble.data.collect import load_silo
from lensemble.data.probe import load_probe
from lensemble.errors import ConfigError, DegenerateProcrustes
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.federation.codec import payload_nbytes, quant_ratio
from lensemble.federation.outer import OuterOptimizer, aggregate_checked
from lensemble.federation.privacy import PrivacyLedger
from lensemble.federation.pseudograd import participant_pipeline, pseudo_gradient
from lensemble.federation.validation import Update, check_egress, require_quorum, validate_updates
from lensemble.gauge.anchor import FrameAnchor
from lensemble.gauge.backstop import align_and_redifference
from lensemble.gauge.distill import aligned_consensus, distill_encoder
from lensemble.gauge.drift import drift_magnitudes, frame_drift
from lensemble.model.encoder import embed_frames
from lensemble.model.objective import sketch_for_round, sketch_for_step
from lensemble.model.world_model import WorldModel, architecture, build_world_model, world_model_from_state
from lensemble.observability.metrics import MetricsSink
from lensemble.data.store import ensure_data
from lensemble.training.loop import InnerLoop

GLOBAL = "global"


# ------------------------------------------------------------------------------------ messages
@dataclass
class Reply:
    """One participant's answer for one round (the only thing that leaves a silo)."""

    round_index: int
    payload: dict[str, np.ndarray]
    probe_embeddings: np.ndarray
    metrics: dict[str, float | int | str | bool] = field(default_factory=dict)

    def egress(self) -> dict:
        """The reply as the egress guard sees it; raises ResidencyViolation on anything extra."""
        out = {"delta": self.payload, "probe_embeddings": self.probe_embeddings, "metrics": self.metrics}
        check_egress(out)
        return out


@dataclass(frozen=True)
class NodeSpec:
    """Where a participant's silo and local state live.

    partition_id: which silo (0-based). data_path: a collection folder (``collection.json``) that
    holds this silo's shards and the public probe; None in simulation (the config's collection).
    state_dir: local folder for the inner optimizer state and the DP ledger across rounds.
    """

    partition_id: int
    data_path: str | None
    state_dir: str

    @property
    def participant_id(self) -> str:
        return f"silo-{self.partition_id}"


# --------------------------------------------------------------------------------- helpers
def to_arrays(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in sorted(state.items())}


def to_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in sorted(arrays.items())}


@lru_cache(maxsize=8)
def _silo_sampler(folder: str, silo: int, clip_len: int, block: int) -> ClipSampler:
    # Cached per process: a simulation actor serves many rounds of the same silo.
    return ClipSampler([load_silo(folder, silo, "train")], clip_len, block)


@lru_cache(maxsize=4)
def _probe_frames(folder: str, expected_hash: str) -> torch.Tensor:
    summary = json.loads((Path(folder) / "collection.json").read_text())
    probe = load_probe(Path(folder) / summary["probe"]["path"], expected_hash=expected_hash)
    return probe.tensor()


def federated_keys(cfg: LensembleConfig) -> frozenset[str]:
    """Names of the tensors that are federated: the trainable parameters.

    Fixed tensors (the encoder's input-standardisation buffers; the whole encoder under Fork A)
    are carried unchanged and never enter a pseudo-gradient, so DP noise or the outer momentum
    can never move them.
    """
    return _federated_keys(cfg.model)


@lru_cache(maxsize=8)
def _federated_keys(model_cfg) -> frozenset[str]:
    model = build_world_model(model_cfg, init_seed=0)  # seeded: leaves the global RNG untouched
    if model_cfg.encoder_frozen:
        for p in model.encoder.parameters():
            p.requires_grad_(False)
    return frozenset(n for n, p in model.named_parameters() if p.requires_grad)


def split_state(state: dict[str, torch.Tensor], keys: frozenset[str]) -> tuple[dict, dict]:
    """(federated part, fixed part) of a full state dict."""
    return ({k: v for k, v in state.items() if k in keys}, {k: v for k, v in state.items() if k not in keys})


def round_sketch_fn(cfg: LensembleConfig, t: int, site: str):
    """SIGReg sketch schedule inside round t: shared per round (rung >= 2) or per-site fresh."""
    d, s = cfg.model.latent_dim, cfg.objective.sigreg_directions
    if cfg.gauge.shared_sketch:
        a = sketch_for_round(cfg.root_seed, t, d, s)
        return lambda i: a
    h = cfg.federation.inner_steps
    return lambda i: sketch_for_step(cfg.root_seed, t * h + i, d, s, site=site)


def make_anchor(cfg: LensembleConfig, model: WorldModel, probe: torch.Tensor, targets: torch.Tensor,
                landmark_idx: torch.Tensor):
    """The pluggable anchor term ``anchor(model) -> scalar`` for the objective, or None."""
    if cfg.gauge.anchor == "none" or cfg.gauge.lambda_anc == 0:
        return None
    anchor = FrameAnchor(targets, landmark_idx, cfg.gauge.anchor, singular_floor=cfg.gauge.singular_floor)
    frames = probe[anchor.landmark_idx]
    return lambda m: anchor(m.encoder(frames))


def _latest_state(state_dir: Path, before_round: int) -> Path | None:
    # Inner state is kept per round so replaying a round after a coordinator restart starts from
    # exactly the state it started from the first time (bitwise resume).
    found = sorted(p for p in state_dir.glob("inner-after-*.pt") if int(p.stem.split("-")[-1]) < before_round)
    return found[-1] if found else None


# ----------------------------------------------------------------------------- participant
def participant_round(cfg: LensembleConfig, node: NodeSpec, global_arrays: dict[str, np.ndarray],
                      round_config: dict, extras: dict[str, np.ndarray] | None = None) -> Reply:
    """Run one DiLoCo round on one silo and return what may leave it.

    ``round_config`` carries "round", "inner-steps" and "probe-hash"; ``extras`` carries the
    public anchor targets ("anchor-targets" (k, d), "anchor-idx" (k,)) when the anchor is on.
    """
    started = time.perf_counter()
    torch.set_num_threads(1)
    t = int(round_config["round"])
    h = int(round_config.get("inner-steps", cfg.federation.inner_steps))
    folder = node.data_path or str(ensure_data(cfg, progress=False)[0])
    probe = _probe_frames(folder, str(round_config["probe-hash"]))
    state_dir = Path(node.state_dir) / node.participant_id
    state_dir.mkdir(parents=True, exist_ok=True)

    global_sd = to_tensors(global_arrays)
    model = world_model_from_state(architecture(cfg.model), global_sd)
    if cfg.model.encoder_frozen:
        for p in model.encoder.parameters():
            p.requires_grad_(False)
    anchor = None
    if extras and "anchor-targets" in extras:
        anchor = make_anchor(cfg, model, probe, torch.from_numpy(extras["anchor-targets"]),
                             torch.from_numpy(extras["anchor-idx"]))
    sampler = _silo_sampler(folder, node.partition_id, cfg.train.clip_len, cfg.model.action_block)
    loop = InnerLoop(model, cfg, sampler, anchor=anchor)
    if (prev := _latest_state(state_dir, t)) is not None:
        loop.load_state_dict(torch.load(prev, weights_only=True))
    reference = embed_frames(model.encoder, probe) if cfg.gauge.backstop else None

    last = loop.run(h, sketch_fn=round_sketch_fn(cfg, t, node.participant_id),
                    generator=torch_generator(cfg.root_seed, "batches", node.participant_id, t),
                    log_every=h)
    torch.save(loop.state_dict(), state_dir / f"inner-after-{t:05d}.pt")
    for old in sorted(state_dir.glob("inner-after-*.pt"))[:-2]:
        old.unlink()

    local_sd = {k: v.detach() for k, v in model.state_dict().items()}
    local_emb = embed_frames(model.encoder, probe)
    metrics = {k: v for k, v in last.items() if k.startswith("loss/")}
    delta = None
    if cfg.gauge.backstop:
        try:
            delta, q, residual = align_and_redifference(local_sd, global_sd, local_emb, reference,
                                                        singular_floor=cfg.gauge.singular_floor)
            frob, angle, *_ = drift_magnitudes(q.unsqueeze(0))
            metrics.update({"gauge/backstop_angle_deg": float(angle[0]), "gauge/backstop_residual": float(frob[0]),
                            "gauge/backstop_fit": float(residual), "gauge/backstop_skipped": 0})
        except DegenerateProcrustes:
            # The rotation is not identifiable from these embeddings (e.g. early collapse):
            # averaging the unaligned update is the honest fallback, and the metric says so.
            metrics["gauge/backstop_skipped"] = 1
    if delta is None:
        delta = pseudo_gradient(local_sd, global_sd)
    keys = federated_keys(cfg)
    delta = {k: v for k, v in delta.items() if k in keys}

    priv = cfg.privacy
    if priv.enabled:
        ledger = PrivacyLedger.from_config(priv)
        ledger_path = state_dir / "dp-ledger.json"
        if ledger_path.exists():
            ledger.load_state_dict(json.loads(ledger_path.read_text()))
        ledger.check_release()  # raises PrivacyBudgetExceeded before anything is released
    release = participant_pipeline(delta, clip_norm=priv.clip_norm if priv.enabled else None,
                                   noise_multiplier=priv.noise_multiplier if priv.enabled else 0.0,
                                   quantize=cfg.federation.quantize_int8)
    if priv.enabled:
        metrics["dp/epsilon"] = ledger.step()
        ledger_path.write_text(json.dumps(ledger.state_dict()))
    metrics.update({
        "fed/update_norm": release.norm_before_clip,
        "fed/update_bytes": release.nbytes,
        "fed/inner_steps": h,
        "fed/compute_seconds": time.perf_counter() - started,
        "fed/examples": h * cfg.train.batch_size,
    })
    reply = Reply(t, release.payload, local_emb.numpy().astype(np.float32), metrics)
    reply.egress()
    return reply


# ----------------------------------------------------------------------------- coordinator
class Coordinator:
    """Server-side round logic with hash-chained, resumable state under ``run_dir``.

    Layout: ``warmstart/`` (or the configured warm start), ``rounds/round-XXXX/model`` and
    ``rounds/round-XXXX/state`` per committed round, ``metrics.jsonl``, ``drift/round-XXXX.json``,
    ``manifest.json`` and, at the end, ``summary.json``.
    """

    def __init__(self, cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.num_rounds = cfg.federation.rounds
        self.data_dir, summary = ensure_data(cfg, progress=progress)
        self.probe_hash = summary["probe"]["content_hash"]
        self.probe = _probe_frames(str(self.data_dir), self.probe_hash)
        self.warmstart_dir, self.warmstart_hash = self._warmstart(progress)
        warm = load_checkpoint(self.warmstart_dir, expected_hash=self.warmstart_hash)
        ref_model = world_model_from_state(warm.architecture, warm.tensors)
        if ref_model.encoder.latent_dim != cfg.model.latent_dim:
            raise ConfigError("the warm start's latent_dim differs from model.latent_dim")
        self.reference_probe = embed_frames(ref_model.encoder, self.probe)  # E_ref = f_ref(P)
        self.extras: dict[str, np.ndarray] = {}
        if cfg.gauge.anchor != "none" and cfg.gauge.lambda_anc > 0:
            anchor = FrameAnchor.from_reference(
                ref_model.encoder, self.probe, k=cfg.gauge.anchor_landmarks, variant=cfg.gauge.anchor,
                seed=derive(cfg.root_seed, "landmarks"), probe_hash=self.probe_hash,
                singular_floor=cfg.gauge.singular_floor)
            self.extras = {"anchor-targets": anchor.targets.numpy().astype(np.float32),
                           "anchor-idx": anchor.landmark_idx.numpy().astype(np.int64)}
        self.ledger = PrivacyLedger.from_config(cfg.privacy) if cfg.privacy.enabled else None
        self.history: list[dict] = []
        self._resume_or_start({k: v for k, v in warm.tensors.items()})
        self.sink = MetricsSink(self.run_dir / "metrics.jsonl")
        write_manifest(build_manifest(cfg, "federated", rounds=self.num_rounds, probe_hash=self.probe_hash,
                                      warmstart_hash=self.warmstart_hash,
                                      dp={"noise_multiplier": cfg.privacy.noise_multiplier if cfg.privacy.enabled else 0.0,
                                          "target_epsilon": cfg.privacy.target_epsilon}), self.run_dir)

    # -- set-up
    def _warmstart(self, progress: bool) -> tuple[Path, str]:
        if self.cfg.federation.warmstart:
            folder = Path(self.cfg.federation.warmstart)
            return folder, read_header(folder)["content_hash"]
        from lensemble.training.warmstart import train_warmstart

        res = train_warmstart(self.cfg, run_dir=self.run_dir / "warmstart", progress=progress)
        return res.checkpoint_dir, res.checkpoint_hash

    def _round_dir(self, t: int) -> Path:
        return self.run_dir / "rounds" / f"round-{t:04d}"

    def _resume_or_start(self, warm_tensors: dict[str, torch.Tensor]) -> None:
        committed = sorted(p for p in (self.run_dir / "rounds").glob("round-*")
                           if (p / "model" / "header.json").exists() and (p / "state" / "header.json").exists())
        cfgh = self.cfg.config_hash()
        self.keys = federated_keys(self.cfg)
        if not committed:
            self.next_round = 0
            self.head_hash = self.warmstart_hash
            params, self.fixed = split_state(warm_tensors, self.keys)
            self.outer = self._outer(params)
            return
        last = committed[-1]
        model = load_checkpoint(last / "model")
        state = load_checkpoint(last / "state")
        if model.header["config_hash"] != cfgh:
            raise ConfigError(f"{self.run_dir} holds rounds of a different config",
                              remediation="use a new run folder or the original overrides")
        params, self.fixed = split_state(model.tensors, self.keys)
        self.outer = self._outer(params)
        self.outer.load_state_dict({**state.header["extra"]["outer"],
                                    "velocity": {k[len("velocity."):]: v for k, v in state.tensors.items()}})
        if self.ledger is not None and state.header["extra"].get("ledger"):
            self.ledger.load_state_dict(state.header["extra"]["ledger"])
        self.history = state.header["extra"].get("history", [])
        self.next_round = model.round_index + 1
        self.head_hash = model.content_hash

    def _outer(self, params: dict[str, torch.Tensor]) -> OuterOptimizer:
        f = self.cfg.federation
        return OuterOptimizer(params, lr=f.outer_lr, momentum=f.outer_momentum, nesterov=f.nesterov)

    # -- per round
    @property
    def done(self) -> bool:
        return self.next_round >= self.num_rounds

    def global_arrays(self) -> dict[str, np.ndarray]:
        return to_arrays(self.global_state())

    def global_state(self) -> dict[str, torch.Tensor]:
        """The full global model: federated parameters plus the fixed tensors."""
        return {**self.fixed, **self.outer.params}

    def round_config(self, t: int) -> dict:
        if self.ledger is not None:
            self.ledger.check_release()  # stop before asking anyone to release an update
        return {"round": t, "inner-steps": self.cfg.federation.inner_steps,
                "sketch-seed": derive(self.cfg.root_seed, "sketch", t), "probe-hash": self.probe_hash,
                "warmstart-hash": self.warmstart_hash, "config-json": json.dumps(self.cfg.model_dump(mode="json"))}

    def close_round(self, t: int, replies: dict[str, Reply], failures: dict[str, str], *,
                    wire_bytes: int | None = None, seconds: float | None = None) -> dict:
        """Aggregate round t and commit it. Raises FaultToleranceExceeded below quorum (nothing
        is committed then, so the same round can be retried)."""
        if t != self.next_round:
            raise ConfigError(f"round {t} closed while round {self.next_round} is open")
        started = time.perf_counter()
        template = self.outer.params
        result = validate_updates([Update(pid, r.round_index, r.payload) for pid, r in sorted(replies.items())],
                                  template=template, round_index=t, max_update_mb=self.cfg.federation.max_update_mb)
        dropped = dict(failures) | {pid: why for pid, why in result.rejected}
        require_quorum(len(result.accepted), self.cfg.federation.min_participants, round_index=t)
        mean = aggregate_checked(result.accepted)
        new_params = self.outer.preview(mean)
        self.outer.commit(mean, expected=new_params)
        accepted = sorted(result.accepted)

        model = world_model_from_state(architecture(self.cfg.model), self.global_state())
        metrics: dict = {}
        consensus = None
        if self.cfg.gauge.distill:
            try:
                consensus, _ = aligned_consensus(
                    {p: torch.from_numpy(replies[p].probe_embeddings) for p in accepted},
                    self.reference_probe, singular_floor=self.cfg.gauge.singular_floor)
            except DegenerateProcrustes:
                metrics["gauge/distill_skipped"] = 1  # no identifiable consensus frame this round
        if consensus is not None:
            res = distill_encoder(model.encoder, self.probe, consensus.float(), steps=self.cfg.gauge.distill_steps,
                                  lr=self.cfg.gauge.distill_lr, seed=derive(self.cfg.root_seed, "distill", t))
            model.encoder.load_state_dict(res.state_dict)
            params, _ = split_state({k: v.detach().clone() for k, v in model.state_dict().items()}, self.keys)
            velocity = self.outer.state_dict()
            self.outer = self._outer(params)
            self.outer.load_state_dict(velocity)
            metrics.update({"gauge/distill_loss_before": res.loss_before, "gauge/distill_loss_after": res.loss_after})

        global_emb = embed_frames(model.encoder, self.probe)
        emb = {p: torch.from_numpy(replies[p].probe_embeddings) for p in accepted} | {GLOBAL: global_emb}
        report = self._drift(emb, t)
        ref_report = self._drift({"warmstart": self.reference_probe, GLOBAL: global_emb}, t)
        if report is not None:
            (self.run_dir / "drift").mkdir(exist_ok=True)
            (self.run_dir / "drift" / f"round-{t:04d}.json").write_text(report.model_dump_json(indent=1))
            metrics.update(report.summary_metrics())
            metrics.update({"gauge/pairwise_angle_deg": report.mean_pairwise_angle_deg,
                            "gauge/pairwise_residual": report.mean_pairwise_residual})
        metrics["gauge/drift_degenerate"] = int(report is None)
        if ref_report is not None:
            metrics["gauge/angle_to_warmstart_deg"] = ref_report.mean_global_angle_deg

        if self.ledger is not None:
            self.ledger.step()
        wire = wire_bytes if wire_bytes is not None else sum(payload_nbytes(replies[p].payload) for p in replies)
        metrics.update({
            "round": t,
            "fed/participants": len(accepted),
            "fed/dropped": len(dropped),
            "fed/comm_bytes": int(wire),
            "fed/quant_ratio": float(np.mean([quant_ratio(replies[p].payload) for p in accepted])),
            "fed/round_seconds": float(seconds if seconds is not None else 0.0),
            "fed/aggregate_seconds": time.perf_counter() - started,
            "gauge/global_effective_dim": effective_dim(global_emb),
            "gauge/global_latent_std": latent_std(global_emb),
            "dp/epsilon": self.ledger.epsilon() if self.ledger is not None else 0.0,
        })
        for key in ("loss/pred", "loss/sigreg", "loss/anchor"):
            vals = [replies[p].metrics[key] for p in accepted if key in replies[p].metrics]
            if vals:
                metrics[key] = float(np.mean(vals))
        metrics["fed/max_compute_seconds"] = max(float(replies[p].metrics.get("fed/compute_seconds", 0.0))
                                                 for p in accepted)
        metrics = {k: v for k, v in metrics.items() if v is not None}
        self.history.append({**metrics, "dropped": dropped})
        self._commit(t, metrics)
        self.sink.log(t, metrics)
        self.next_round = t + 1
        return metrics

    def _drift(self, embeddings: dict[str, torch.Tensor], t: int):
        """FrameDriftReport, or None when some pair's rotation is not identifiable (collapse)."""
        try:
            return frame_drift(embeddings, round_index=t, probe_hash=self.probe_hash,
                               expected_probe_hash=self.probe_hash, singular_floor=self.cfg.gauge.singular_floor)
        except DegenerateProcrustes:
            return None

    def _commit(self, t: int, metrics: dict) -> None:
        folder = self._round_dir(t)
        arch = architecture(self.cfg.model)
        cfgh = self.cfg.config_hash()
        model_hash = save_checkpoint(folder / "model", self.global_state(), kind="world_model", round_index=t,
                                     parent_hash=self.head_hash, config_hash=cfgh, architecture=arch,
                                     extra={"probe_hash": self.probe_hash, "warmstart_hash": self.warmstart_hash,
                                            "rung": self.cfg.gauge.rung})
        outer_state = self.outer.state_dict()
        velocity = outer_state.pop("velocity")
        save_checkpoint(folder / "state", {f"velocity.{k}": v for k, v in velocity.items()},
                        kind="coordinator_state", round_index=t, parent_hash=model_hash, config_hash=cfgh,
                        extra={"outer": outer_state, "history": self.history,
                               "ledger": self.ledger.state_dict() if self.ledger else None})
        self.head_hash = model_hash

    def finish(self) -> dict:
        """Write and return ``summary.json`` (final hash, per-round metrics)."""
        summary = {
            "rounds_completed": self.next_round,
            "final_checkpoint": str(self._round_dir(self.next_round - 1) / "model") if self.next_round else None,
            "final_hash": self.head_hash,
            "warmstart_hash": self.warmstart_hash,
            "probe_hash": self.probe_hash,
            "config_hash": self.cfg.config_hash(),
            "rounds": self.history,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))
        self.sink.close()
        return summary


def config_from_round(round_config: dict) -> LensembleConfig:
    """The run's config as sent by the coordinator (a SuperNode has no config of its own)."""
    try:
        return validate_config(json.loads(round_config["config-json"]))
    except KeyError:
        raise ConfigError("the round config carries no config-json",
                          remediation="the coordinator and this node run different Lensemble versions") from None


__all__ = ["Reply", "NodeSpec", "participant_round", "Coordinator", "config_from_round"]
