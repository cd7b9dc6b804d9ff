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
import uuid
from pathlib import Path

import numpy as np
import torch

from lensemble.artifacts.checkpoint import load_checkpoint, read_header, save_checkpoint
from lensemble.artifacts.manifest import build_manifest, write_manifest
from lensemble.artifacts.storage import remove_stale_temps, storage_errors, write_bytes_atomic
from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import derive
from lensemble.data.probe import probe_split_for
from lensemble.data.residency import guard_export
from lensemble.data.store import ensure_data, probe_frames
from lensemble.errors import (
    CheckpointIntegrityError,
    ConfigError,
    DegenerateProcrustes,
    PrivacyBudgetExceeded,
    ProbeError,
)
from lensemble.federation.bn_stats import probe_spread, recalibrate_on_probe
from lensemble.federation.checks import check_federation_config
from lensemble.federation.codec import payload_nbytes, quant_ratio
from lensemble.federation.global_cache import cache_config, global_digest
from lensemble.federation.locks import lock_folder
from lensemble.federation.messages import Reply, participant_id
from lensemble.federation.outer import OuterOptimizer, outer_step_size
from lensemble.federation.pooling import (
    GRADIENT_PHASE,
    MEMBERS,
    MOMENTS_PHASE,
    SUMMARY_PHASE,
    close_secure_summaries,
    close_summaries,
    members_key,
    needs_gradient_pass,
    needs_moments_first,
)
from lensemble.federation.privacy import PrivacyLedger, ReleaseTally
from lensemble.federation.pseudograd import Layout
from lensemble.federation.robust import (
    required_participants,
    robust_mean,
    screen_updates,
    secure_update_settings,
)
from lensemble.federation.secure_agg import SecureSum, check_secure_sum, mean_from_sum
from lensemble.federation.state import federated_keys, split_state, to_arrays
from lensemble.federation.validation import (
    Update,
    check_contributors,
    refuse_individual,
    require_quorum,
    validate_updates,
)
from lensemble.gauge.anchor import FrameAnchor
from lensemble.gauge.distill import aligned_consensus, distill_encoder
from lensemble.gauge.drift import GLOBAL_KEY, frame_drift
from lensemble.federation.stability import stability_record
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.model.encoder import embed_frames
from lensemble.model.objective import LOSS_TERMS
from lensemble.model.world_model import architecture, world_model_from_state
from lensemble.observability.metrics import MetricsSink
from lensemble.training.pooling import pools_anything
from lensemble.training.warmstart import train_warmstart, warmstart_config


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
        check_federation_config(cfg)
        # One process per run folder, for the life of the run (released by finish(), or by the
        # kernel when the process ends): a second run here is refused, naming this one.
        # Under the ray engine this is a hold delegated by the driver (locks.py), verified before
        # every commit so an orphaned coordinator cannot write here after the driver died.
        self._lock = lock_folder(self.run_dir, what="run folder")
        try:
            # a full disk / read-only run folder is DiskFull / ReadOnlyFolder naming the path
            with storage_errors(self.run_dir, "run folder", access=False):
                self._set_up(progress)
        except BaseException:
            self._lock.release()
            raise

    def _set_up(self, progress: bool) -> None:
        cfg = self.cfg
        # half-written checkpoint folders (.model.<random>, .state.<random>) of a killed or failed
        # commit; only uncommitted work, and nobody else writes here while we hold the folder
        remove_stale_temps(self.run_dir / "rounds", recursive=True)
        self.num_rounds = cfg.federation.rounds
        self.run_id = _run_id(self.run_dir)
        self.data_dir, summary = ensure_data(cfg, progress=progress)
        self.probe_hash = summary["probe"]["content_hash"]
        self.probe = probe_frames(str(self.data_dir), self.probe_hash)
        self.warmstart_dir, self.warmstart_hash = self._warmstart(progress)
        warm = load_checkpoint(self.warmstart_dir, expected_hash=self.warmstart_hash)
        ref_model = world_model_from_state(warm.architecture, warm.tensors)
        if ref_model.encoder.latent_dim != cfg.model.latent_dim:
            raise ConfigError("the warm start's latent_dim differs from model.latent_dim")
        self.reference_probe = embed_frames(ref_model.encoder, self.probe)  # E_ref = f_ref(P)
        # [stability] the warm start as the rounds' globals are measured (statistics re-estimated on
        # the probe): the reference of the run's watch for coming apart (federation/stability.py)
        self._warmstart_spread = probe_spread(ref_model.encoder, self.probe, cfg)
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
        self.tally = ReleaseTally(self.run_dir / "privacy.json", cfg.data.num_silos) if self.ledger else None
        self.history: list[dict] = []
        self._summary_metrics: dict | None = None  # the open round's summary ask (pooled objective)
        self._summary_round: int | None = None  # the round _summary_metrics belong to
        self._summary_members: tuple[int, list[str]] | None = None  # (round, who kept its global)
        self._resume_or_start({k: v for k, v in warm.tensors.items()})
        self._check_or_write_manifest()
        self.sink = MetricsSink(self.run_dir / "metrics.jsonl")

    # -- set-up
    def _warmstart(self, progress: bool) -> tuple[Path, str]:
        if self.cfg.federation.warmstart:
            folder = Path(self.cfg.federation.warmstart)
            return folder, read_header(folder)["content_hash"]
        found = _own_warmstart(self.cfg, self.run_dir / "warmstart")
        if found is not None:  # trained by an earlier start of this run: reuse it, never re-train
            return found
        res = train_warmstart(self.cfg, run_dir=self.run_dir / "warmstart", progress=progress)
        return res.checkpoint_dir, res.checkpoint_hash

    def _check_or_write_manifest(self) -> None:
        """Write manifest.json on a fresh run; on a resume, refuse one that pins other inputs.

        The manifest is what a run *was*: it is never rewritten, so a resumed run cannot replace
        the hashes its first rounds were made with.
        """
        path = self.run_dir / "manifest.json"
        if path.exists():
            old = json.loads(path.read_text())
            for key, now in (("config_hash", self.cfg.config_hash()), ("probe_hash", self.probe_hash),
                             ("warmstart_hash", self.warmstart_hash)):
                if old.get(key) != now:
                    raise ConfigError(
                        f"{path} pins {key} {str(old.get(key))[:16]}…, this run has {now[:16]}…",
                        remediation="resume with the data, warm start and overrides the run started "
                                    "with, or use a new run folder")
            return
        write_manifest(build_manifest(self.cfg, "federated", rounds=self.num_rounds, probe_hash=self.probe_hash,
                                      warmstart_hash=self.warmstart_hash,
                                      dp={"noise_multiplier": self.cfg.privacy.noise_multiplier
                                          if self.cfg.privacy.enabled else 0.0,
                                          "target_epsilon": self.cfg.privacy.target_epsilon}), self.run_dir)

    def _round_dir(self, t: int) -> Path:
        return self.run_dir / "rounds" / f"round-{t:04d}"

    def _resume_or_start(self, warm_tensors: dict[str, torch.Tensor]) -> None:
        committed = sorted(p for p in (self.run_dir / "rounds").glob("round-*")
                           if (p / "model" / "header.json").exists() and (p / "state" / "header.json").exists())
        self.keys = federated_keys(self.cfg)
        if not committed:
            self.next_round = 0
            self.head_hash = self.warmstart_hash
            params, self.fixed = split_state(warm_tensors, self.keys)
            self.outer = self._outer(params)
            return
        self._verify_chain(committed)
        last = committed[-1]
        model = load_checkpoint(last / "model")
        state = load_checkpoint(last / "state")
        params, self.fixed = split_state(model.tensors, self.keys)
        self.outer = self._outer(params)
        self.outer.load_state_dict({**state.header["extra"]["outer"],
                                    "velocity": {k[len("velocity."):]: v for k, v in state.tensors.items()}})
        self.history = state.header["extra"].get("history", [])
        self.next_round = model.round_index + 1
        self.head_hash = model.content_hash

    def _verify_chain(self, committed: list[Path]) -> None:
        """Refuse to resume unless the committed rounds are one unbroken chain of this run.

        Checks, per round k (headers only; the last round is fully verified when it is loaded):
        the folder is round k of 0..n-1; the model was made with this config, this probe and this
        warm start, and its parent is round k-1's model (round 0's: the warm start); the
        coordinator state beside it belongs to exactly that model. Any mismatch names what
        differs.
        """
        cfgh = self.cfg.config_hash()
        parent = self.warmstart_hash
        for k, folder in enumerate(committed):
            name = folder.name
            if name != f"round-{k:04d}":
                raise CheckpointIntegrityError(
                    f"{self.run_dir / 'rounds'} has {name} where round-{k:04d} should be: the chain is broken",
                    remediation="restore the missing round or start a new run folder")
            model, state = read_header(folder / "model"), read_header(folder / "state")
            extra = model.get("extra", {})
            if model["config_hash"] != cfgh:
                raise ConfigError(f"{self.run_dir} holds rounds of a different config ({name}: "
                                  f"{model['config_hash'][:16]}…, this run {cfgh[:16]}…)",
                                  remediation="use a new run folder or the original overrides")
            if extra.get("probe_hash") != self.probe_hash:
                raise ProbeError(
                    f"{name} was measured on probe {str(extra.get('probe_hash'))[:16]}…, "
                    f"the data now holds probe {self.probe_hash[:16]}…",
                    remediation="resume with the collection the run started with, or use a new run folder")
            if extra.get("warmstart_hash") != self.warmstart_hash or (k == 0 and model["parent_hash"] != parent):
                raise ConfigError(
                    f"{name} chains to warm start {str(extra.get('warmstart_hash'))[:16]}…, "
                    f"this run's warm start is {self.warmstart_hash[:16]}…",
                    remediation="resume with the warm start the run started with (federation.warmstart)")
            if model["parent_hash"] != parent or int(model["round_index"]) != k:
                raise CheckpointIntegrityError(
                    f"{name}/model (round {model['round_index']}) has parent {str(model['parent_hash'])[:16]}…, "
                    f"expected {parent[:16]}… (the previous round's model)",
                    remediation="restore the round folders from one run, or start a new run folder")
            if state["parent_hash"] != model["content_hash"] or int(state["round_index"]) != k:
                raise CheckpointIntegrityError(
                    f"{name}/state is the coordinator state of round {state['round_index']} "
                    f"(model {str(state['parent_hash'])[:16]}…), not of {name}'s model "
                    f"{model['content_hash'][:16]}…",
                    remediation="restore the state saved with this round, or start a new run folder")
            parent = model["content_hash"]

    def _outer(self, params: dict[str, torch.Tensor]) -> OuterOptimizer:
        f = self.cfg.federation
        # [pooled] divided by the best-response overshoot 1 + κ(C − 1) when federation.response_kappa is set
        lr = outer_step_size(f.outer_lr, self.cfg.data.num_silos, f.response_kappa)
        return OuterOptimizer(params, lr=lr, momentum=f.outer_momentum, nesterov=f.nesterov)

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
            self._check_budget()  # stop before asking anyone to release an update
        # What a participant reads: the round, H, the probe it must verify, the run's identity
        # (its state folder must be this run's), and the whole config (a SuperNode has no config
        # of its own). The sketch comes from the config's root seed.
        return {"round": t, "inner-steps": self.cfg.federation.inner_steps, "probe-hash": self.probe_hash,
                "run-id": self.run_id, "config-json": json.dumps(self.cfg.model_dump(mode="json"))}

    # -- the pooled objective's summary ask (federation/pooling.py)
    @property
    def pools(self) -> bool:
        """Whether each round starts with the summary ask (objective.sigreg_scope / bn_scope = pooled)."""
        return pools_anything(self.cfg)

    @property
    def moments_first(self) -> bool:
        """Whether each round's summary ask is preceded by the moments ask (SIGReg and BatchNorm
        both pooled: the ECF summaries are encoded under the round's pooled moments)."""
        return needs_moments_first(self.cfg)

    @property
    def gradient_pass(self) -> bool:
        """Whether each round's summary ask is followed by the moment-gradient ask (BatchNorm pooled
        with ``objective.bn_cross_gradient``)."""
        return needs_gradient_pass(self.cfg)

    def summary_config(self, t: int) -> dict:
        return {**self.round_config(t), "phase": SUMMARY_PHASE}

    def moments_config(self, t: int) -> dict:
        return {**self.round_config(t), "phase": MOMENTS_PHASE}

    def gradient_config(self, t: int) -> dict:
        return {**self.round_config(t), "phase": GRADIENT_PHASE}

    def close_gradients(self, t: int, replies: dict[str, Reply], failures: dict[str, str], *,
                        wire_bytes: int | None = None, secure_sum: SecureSum | None = None) -> dict[str, np.ndarray]:
        """The pooled mean of round t's moment gradients as extras for the train ask (with
        ``pooled.bngrad-members``); like :meth:`close_summaries`, whose bytes it joins."""
        return self.close_summaries(t, replies, failures, wire_bytes=wire_bytes, secure_sum=secure_sum,
                                    phase=GRADIENT_PHASE)

    def close_moments(self, t: int, replies: dict[str, Reply], failures: dict[str, str], *,
                      wire_bytes: int | None = None, secure_sum: SecureSum | None = None) -> dict[str, np.ndarray]:
        """The pooled mean of round t's BatchNorm moments as extras for the summary ask (the
        moments pass); like :meth:`close_summaries`, whose bytes it joins."""
        return self.close_summaries(t, replies, failures, wire_bytes=wire_bytes, secure_sum=secure_sum,
                                    phase=MOMENTS_PHASE)

    def close_summaries(self, t: int, replies: dict[str, Reply], failures: dict[str, str], *,
                        wire_bytes: int | None = None, secure_sum: SecureSum | None = None,
                        phase: str = SUMMARY_PHASE) -> dict[str, np.ndarray]:
        """The pooled mean of round t's summaries as extras for the train ask (or, ``phase``
        moments, of their BatchNorm moments for the summary ask); its metrics join the round's when
        it closes. Raises FaultToleranceExceeded below the quorum.

        Under ``federation.secure_aggregation`` the summaries come as ``secure_sum`` (their SecAgg+
        sum) and replies that carry none; an individual summary is refused
        (:func:`~lensemble.federation.pooling.close_secure_summaries`)."""
        if self.cfg.federation.secure_aggregation or secure_sum is not None:
            if not self.cfg.federation.secure_aggregation:
                raise ConfigError(f"round {t}'s summaries came as a secure sum but federation.secure_aggregation "
                                  "is off", remediation="run the coordinator with the config the participants "
                                                        "were asked with")
            extras, metrics = close_secure_summaries(self.cfg, t, replies, failures, secure_sum, phase)
        else:
            extras, metrics = close_summaries(self.cfg, t, replies, failures, phase)
        wire = wire_bytes if wire_bytes is not None else sum(payload_nbytes(r.payload) for r in replies.values())
        first = MOMENTS_PHASE if self.moments_first else SUMMARY_PHASE
        # the round's summary bytes count every pass; the first pass of an attempt starts afresh
        earlier = self._summary_metrics if phase != first and self._summary_round == t else None
        word = {MOMENTS_PHASE: "moments", SUMMARY_PHASE: "summary", GRADIENT_PHASE: "gradient"}[phase]
        metrics = {k.replace("fed/summary_", f"fed/{word}_"): v for k, v in metrics.items()}
        self._summary_metrics = {**(earlier or {}), **metrics,
                                 "fed/summary_bytes": int(wire) + int((earlier or {}).get("fed/summary_bytes", 0))}
        self._summary_round = t
        if phase != GRADIENT_PHASE:  # who kept this round's global: those of the latest pass
            members = np.asarray(extras[members_key(phase)]).ravel()
            self._summary_members = (t, [participant_id(int(m)) for m in members])
        return extras

    def global_cache_config(self, t: int) -> dict:
        """Round-config entries for round t's train ask after its summary ask: the global's digest
        and the participants whose summary was accepted, who kept that global and are sent none
        (:mod:`lensemble.federation.global_cache`); empty when round t had no summary ask."""
        members = getattr(self, "_summary_members", None)
        if members is None or members[0] != t:
            return {}
        return cache_config(global_digest(self.global_arrays()), members[1])

    def _check_budget(self) -> None:
        bound = self.tally.bound()
        eps = self.ledger.epsilon_for(bound + 1)
        target = self.ledger.target_epsilon
        if target is not None and not eps <= target:
            raise PrivacyBudgetExceeded(
                f"asking again would let a silo bring ε to {eps:.4g} > target {target:.4g} "
                f"(δ={self.ledger.delta:g}, up to {bound} release(s) so far)",
                epsilon=eps, target_epsilon=target, releases=bound)

    def before_ask(self, t: int) -> None:
        """Called by the round driver just before each ask: counts it, durably, under DP."""
        if self.tally is not None:
            self.tally.before_ask()

    def epsilon(self) -> float:
        """ε of the silo that may have released most (0 without privacy); see ReleaseTally."""
        return self.ledger.epsilon_for(self.tally.bound()) if self.ledger is not None else 0.0

    def close_round(self, t: int, replies: dict[str, Reply], failures: dict[str, str], *,
                    wire_bytes: int | None = None, seconds: float | None = None,
                    secure_sum: SecureSum | None = None) -> dict:
        """Aggregate round t and commit it. Raises FaultToleranceExceeded below quorum (nothing
        is committed then, so the same round can be retried).

        Under ``federation.secure_aggregation`` the round comes as ``secure_sum`` (S = Σ Δ_c over
        its contributors) and replies that carry no update; individual updates are refused.
        """
        if t != self.next_round:
            raise ConfigError(f"round {t} closed while round {self.next_round} is open")
        started = time.perf_counter()
        if self.tally is not None:  # every reply is a release that happened, usable or not
            for pid, r in sorted(replies.items()):
                n = r.metrics.get("dp/releases")
                if isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 0:
                    self.tally.record(pid, int(n))
        # Under DP the participants withhold their probe embeddings: (0, d) is the only valid form.
        rows = 0 if self.cfg.privacy.enabled else len(self.probe)
        branch_metrics: dict = {}
        norms: dict[str, float] = {}  # accepted id -> ‖Δ‖₂ (plaintext rounds): the next rounds' reference
        if self.cfg.federation.secure_aggregation or secure_sum is not None:
            mean, accepted, dropped, branch_metrics = self._secure_mean(t, replies, failures, secure_sum, rows)
        else:
            result = validate_updates([Update(pid, r.round_index, r.payload, r.probe_embeddings)
                                       for pid, r in sorted(replies.items())],
                                      template=self.outer.params, round_index=t,
                                      max_update_mb=self.cfg.federation.max_update_mb,
                                      embedding_shape=(rows, self.cfg.model.latent_dim))
            dropped = dict(failures) | {pid: f"sent an unusable reply ({why})" for pid, why in result.rejected}
            # [robust] a well-formed update above the round's norm bound is dropped like an unusable one
            kept, refused, branch_metrics, norms = screen_updates(self.cfg, result.accepted, self.history,
                                                                  self.outer.params)
            dropped |= refused
            require_quorum(len(kept), required_participants(self.cfg), round_index=t, failures=dropped)
            mean = robust_mean(kept, self.cfg.federation.aggregate, self.cfg.federation.trim)
            accepted = sorted(kept)
        new_params = self.outer.preview(mean)
        self.outer.commit(mean, expected=new_params)

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
        # The global's BatchNorm statistics follow its new weights (re-estimated on the public probe)
        # and are committed with them; before the probe is embedded, so drift sees the committed model.
        if recalibrate_on_probe(model.encoder, self.probe, self.cfg):
            _, self.fixed = split_state({k: v.detach().clone() for k, v in model.state_dict().items()}, self.keys)

        global_emb = embed_frames(model.encoder, self.probe)
        # Under DP no participant embeddings arrive: drift is then only global vs warm start.
        report = None
        if not self.cfg.privacy.enabled:
            emb = {p: torch.from_numpy(replies[p].probe_embeddings)[self._ms] for p in accepted} | {GLOBAL_KEY: global_emb[self._ms]}
            report = self._drift(emb, t)
        ref_report = self._drift({"warmstart": self.reference_probe[self._ms], GLOBAL_KEY: global_emb[self._ms]}, t)
        self._lock.verify()  # the first write of the round: refused to an orphaned coordinator
        if report is not None:
            with storage_errors(self.run_dir / "drift", "drift report"):
                (self.run_dir / "drift").mkdir(exist_ok=True)
                (self.run_dir / "drift" / f"round-{t:04d}.json").write_text(report.model_dump_json(indent=1))
            metrics.update(report.summary_metrics())
            metrics.update(report.pairwise_metrics())  # [gauge] between participants, no global frame
        if report is not None:
            # 1: some participant's full rotation was not identifiable this round, so the full-rotation
            # angle is unmeasured (absent) while the identified-subspace numbers are still recorded.
            metrics["gauge/drift_degenerate"] = int(bool(report.degenerate_pairs))
        if ref_report is not None and ref_report.mean_global_angle_deg is not None:
            metrics["gauge/angle_to_warmstart_deg"] = ref_report.mean_global_angle_deg

        wire = wire_bytes if wire_bytes is not None else sum(payload_nbytes(replies[p].payload) for p in replies)
        summary_metrics = getattr(self, "_summary_metrics", None) or {}
        self._summary_metrics = None
        wire += summary_metrics.get("fed/summary_bytes", 0)  # the round's bytes include its summary ask
        metrics.update(summary_metrics)
        metrics.update({
            "round": t,
            "fed/participants": len(accepted),
            "fed/outer_lr": self.outer.lr,  # after federation.response_kappa's division, when set
            "fed/dropped": len(dropped),
            "fed/comm_bytes": int(wire),
            "fed/quant_ratio": (float(np.mean([quant_ratio(replies[p].payload) for p in accepted]))
                                if secure_sum is None else None),
            "fed/round_seconds": float(seconds if seconds is not None else 0.0),
            "fed/aggregate_seconds": time.perf_counter() - started,
            "gauge/global_effective_dim": effective_dim(global_emb),
            "gauge/global_latent_std": latent_std(global_emb),
            "dp/epsilon": self.epsilon(),
        })
        if self.tally is not None:
            metrics["dp/releases_bound"] = self.tally.bound()
        metrics.update(branch_metrics)
        for key in (f"loss/{term}" for term in LOSS_TERMS):  # the participants' last inner step, averaged
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
        self.history.append({**metrics, "dropped": dropped, **({"update_norms": norms} if norms else {})})
        self._commit(t, metrics)
        with storage_errors(self.sink.path, "metrics log"):
            self.sink.log(t, metrics)
        self.next_round = t + 1
        return {**metrics, "dropped": dropped}  # the driver's round line names the refused replies

    def _secure_mean(self, t: int, replies: dict[str, Reply], failures: dict[str, str],
                     secure_sum: SecureSum | None, rows: int):
        """(Δ̄ = S / C, participants with usable side data, dropped, metrics) of a secure round.

        The coordinator never holds an individual update here: a reply that carries one, or a
        round that comes without a sum, is refused. The sum must pass :func:`check_secure_sum`
        (finite, n coordinates, within C x the per-update bounds) or the round fails closed.
        """
        if not self.cfg.federation.secure_aggregation:
            raise ConfigError(f"round {t} came as a secure sum but federation.secure_aggregation is off",
                              remediation="run the coordinator with the config the participants were asked with")
        refuse_individual(t, replies, secure_sum, "update", "updates")
        settings = secure_update_settings(self.cfg, self.outer.params)  # B: the run's step bound by default
        layout = Layout.of(self.outer.params)
        contributors = list(secure_sum.contributors)
        dropped = dict(failures)
        require_quorum(len(contributors), max(self.cfg.federation.min_participants, settings.threshold),
                       round_index=t, failures=dropped)
        checked = check_secure_sum(secure_sum.total, len(contributors), layout.numel, settings, round_index=t)
        mean = mean_from_sum(secure_sum.total, len(contributors), layout)
        # Their updates are in the sum whatever their side data; only usable side data (the
        # probe embeddings) enters drift and distillation.
        accepted = check_contributors(t, contributors, replies, (rows, self.cfg.model.latent_dim), "sum")
        metrics = {**checked, "fed/secagg_participants": len(contributors), "fed/secagg_clip_range": settings.clip_range,
                   "fed/secagg_bits": settings.bits, "fed/secagg_mean_error_bound": settings.mean_error_bound(),
                   "fed/secagg_max_norm": settings.norm_bound(layout.numel)}
        return mean, accepted, dropped, metrics

    def _drift(self, embeddings: dict[str, torch.Tensor], t: int):
        """The round's FrameDriftReport. A pair whose full rotation is not identifiable (latents with
        dead directions) is masked, not fatal: its full-rotation angle is None, its identified-subspace
        numbers are kept (frame_drift, ``degenerate="mask"``)."""
        return frame_drift(embeddings, round_index=t, probe_hash=self.probe_hash,
                           expected_probe_hash=self.probe_hash, singular_floor=self.cfg.gauge.singular_floor,
                           probe_subset={"role": "measurement", **self.split.record()}, degenerate="mask")

    def _commit(self, t: int, metrics: dict) -> None:
        self._lock.verify()  # RunOwnerGone once the driver that holds the folder is gone
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
                               "ledger": self.tally.state_dict() if self.tally else None})
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
            # [stability] did the rounds come apart? (pooled SIGReg growth, effective dimension, spread)
            "stability": stability_record(self.history, *self._warmstart_spread),
        }
        self._lock.verify()
        # whole or not at all: a full disk must not leave a truncated summary.json a reader trusts
        write_bytes_atomic(self.run_dir / "summary.json",
                           json.dumps(summary, indent=1, sort_keys=True, default=str).encode(), what="run summary")
        self.sink.close()
        self._lock.release()
        return summary


def _run_id(run_dir: Path) -> str:
    """This run folder's identity (made once, on a fresh run): participants' state folders are
    claimed for it, so no other run can load their inner state."""
    path = run_dir / "run-id"
    if path.exists():
        return path.read_text().strip()
    rid = uuid.uuid4().hex
    path.write_text(rid + "\n")
    return rid


def _own_warmstart(cfg: LensembleConfig, folder: Path) -> tuple[Path, str] | None:
    """The warm start an earlier start of this run trained in ``folder``, if it is there and was
    made with this config; else None (then it is trained)."""
    result = folder / "result.json"
    if not result.exists():
        return None
    info = json.loads(result.read_text())
    ws_cfg = warmstart_config(cfg)  # the config train_warmstart trains with
    ckpt = folder / "checkpoints" / f"step-{cfg.train.warmstart_steps:06d}"
    if not (ckpt / "header.json").exists():
        return None
    header = read_header(ckpt)
    if header["content_hash"] != info.get("checkpoint_hash") or header["config_hash"] != ws_cfg.config_hash():
        return None
    return ckpt, header["content_hash"]


__all__ = ["Coordinator", "check_federation_config"]
