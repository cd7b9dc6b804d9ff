"""The coordinator's side of a DiLoCo round, framework-free: what the server does with the replies.

Round t: validate the replies, require a quorum, average in sorted participant order in fp64, take
the Nesterov outer step, optionally distil the global encoder toward the aligned consensus (rung
5), measure frame drift on the public probe, and commit a hash-chained checkpoint plus the
coordinator's own state, so a restarted coordinator continues bitwise identically. Asking the
participants is not its business: the round driver (:mod:`lensemble.federation.rounds`) does that
through whichever engine runs the federation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from lensemble.artifacts.checkpoint import load_checkpoint, read_header, save_checkpoint
from lensemble.artifacts.manifest import build_manifest, write_manifest
from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import derive
from lensemble.data.residency import guard_export
from lensemble.data.probe import probe_split_for
from lensemble.data.store import ensure_data, probe_frames
from lensemble.errors import ConfigError, DegenerateProcrustes
from lensemble.federation.codec import payload_nbytes, quant_ratio
from lensemble.federation.messages import Reply
from lensemble.federation.outer import OuterOptimizer, aggregate_checked
from lensemble.federation.privacy import PrivacyLedger
from lensemble.federation.state import federated_keys, split_state, to_arrays
from lensemble.federation.validation import Update, require_quorum, validate_updates
from lensemble.gauge.anchor import FrameAnchor
from lensemble.gauge.distill import aligned_consensus, distill_encoder
from lensemble.gauge.drift import GLOBAL_KEY, frame_drift
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.model.encoder import embed_frames
from lensemble.model.world_model import architecture, world_model_from_state
from lensemble.observability.metrics import MetricsSink
from lensemble.training.warmstart import train_warmstart


class Coordinator:
    """Server-side round logic with hash-chained, resumable state under ``run_dir``.

    Layout: ``warmstart/`` (or the configured warm start), ``rounds/round-XXXX/model`` and
    ``rounds/round-XXXX/state`` per committed round, ``metrics.jsonl``, ``drift/round-XXXX.json``,
    ``manifest.json`` and, at the end, ``summary.json``.
    """

    def __init__(self, cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        guard_export(self.run_dir)  # checkpoints, metrics and reports leave with the run folder
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.num_rounds = cfg.federation.rounds
        self.data_dir, summary = ensure_data(cfg, progress=progress)
        self.probe_hash = summary["probe"]["content_hash"]
        self.probe = probe_frames(str(self.data_dir), self.probe_hash)
        self.warmstart_dir, self.warmstart_hash = self._warmstart(progress)
        warm = load_checkpoint(self.warmstart_dir, expected_hash=self.warmstart_hash)
        ref_model = world_model_from_state(warm.architecture, warm.tensors)
        if ref_model.encoder.latent_dim != cfg.model.latent_dim:
            raise ConfigError("the warm start's latent_dim differs from model.latent_dim")
        self.reference_probe = embed_frames(ref_model.encoder, self.probe)  # E_ref = f_ref(P)
        # [gauge] The probe's landmark / measurement split (docs/gauge.md §4): the anchor, the backstop
        # and the distillation fit on the landmark frames; every drift number uses the measurement frames.
        self.split = probe_split_for(cfg, self.probe_hash, len(self.probe))
        self._lm = torch.from_numpy(self.split.landmark_idx)
        self._ms = torch.from_numpy(self.split.measurement_idx)
        self.extras: dict[str, np.ndarray] = {}
        if cfg.gauge.anchor != "none" and cfg.gauge.lambda_anc > 0:
            anchor = FrameAnchor.from_reference(
                ref_model.encoder, self.probe, k=cfg.gauge.anchor_landmarks, variant=cfg.gauge.anchor,
                seed=derive(cfg.root_seed, "landmarks"), probe_hash=self.probe_hash,
                singular_floor=cfg.gauge.singular_floor, landmark_idx=self._lm)
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
        # What a participant reads: the round, H, the probe it must verify, and the whole config
        # (a SuperNode has no config of its own). The sketch comes from the config's root seed.
        return {"round": t, "inner-steps": self.cfg.federation.inner_steps, "probe-hash": self.probe_hash,
                "config-json": json.dumps(self.cfg.model_dump(mode="json"))}

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
                    {p: torch.from_numpy(replies[p].probe_embeddings)[self._lm] for p in accepted},
                    self.reference_probe[self._lm], singular_floor=self.cfg.gauge.singular_floor)
            except DegenerateProcrustes:
                metrics["gauge/distill_skipped"] = 1  # no identifiable consensus frame this round
        if consensus is not None:
            res = distill_encoder(model.encoder, self.probe[self._lm], consensus.float(), steps=self.cfg.gauge.distill_steps,
                                  lr=self.cfg.gauge.distill_lr, seed=derive(self.cfg.root_seed, "distill", t))
            model.encoder.load_state_dict(res.state_dict)
            params, _ = split_state({k: v.detach().clone() for k, v in model.state_dict().items()}, self.keys)
            velocity = self.outer.state_dict()
            self.outer = self._outer(params)
            self.outer.load_state_dict(velocity)
            metrics.update({"gauge/distill_loss_before": res.loss_before, "gauge/distill_loss_after": res.loss_after})

        global_emb = embed_frames(model.encoder, self.probe)
        emb = {p: torch.from_numpy(replies[p].probe_embeddings)[self._ms] for p in accepted} | {GLOBAL_KEY: global_emb[self._ms]}
        report = self._drift(emb, t)
        ref_report = self._drift({"warmstart": self.reference_probe[self._ms], GLOBAL_KEY: global_emb[self._ms]}, t)
        if report is not None:
            (self.run_dir / "drift").mkdir(exist_ok=True)
            (self.run_dir / "drift" / f"round-{t:04d}.json").write_text(report.model_dump_json(indent=1))
            metrics.update(report.summary_metrics())
            metrics.update(report.pairwise_metrics())  # [gauge] between participants, no global frame
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
        # [gauge] What the backstop removed and what it left (gauge.backstop.backstop_metrics), mean over participants.
        for key in sorted({k for p in accepted for k in replies[p].metrics if k.startswith("gauge/backstop_")}):
            vals = [float(replies[p].metrics[key]) for p in accepted if key in replies[p].metrics]
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
                               expected_probe_hash=self.probe_hash, singular_floor=self.cfg.gauge.singular_floor,
                               probe_subset={"role": "measurement", **self.split.record()})
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
            "probe_split": self.split.record(),
            "config_hash": self.cfg.config_hash(),
            "rounds": self.history,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))
        self.sink.close()
        return summary


__all__ = ["Coordinator"]
