"""The participant's side of a DiLoCo round, framework-free: what one silo does with the global.

Round t (DESIGN.md §4): load the global weights, run H inner AdamW steps on the silo's own clips
(the inner optimizer state stays on the silo's disk across rounds), then, in this order
(INV-ALIGN-BEFORE-RELEASE): backstop alignment of the full weights and re-difference, clip, DP
noise, int8. The reply carries the encoded pseudo-gradient, the local encoder's (unaligned)
embeddings of the public probe, and scalars; the egress guard checks it before it leaves. With
privacy on it carries the clipped, noised pseudo-gradient and count-only scalars, nothing else
(docs/federation.md, "Privacy").
"""

from __future__ import annotations

import io
import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from lensemble.artifacts.storage import remove_stale_temps, storage_errors, write_bytes_atomic
from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import batch_labels, torch_generator
from lensemble.data.clips import ClipSampler
from lensemble.data.collect import load_silo
from lensemble.data.probe import probe_split_for
from lensemble.data.store import ensure_data, probe_frames
from lensemble.errors import DegenerateProcrustes, FolderInUse
from lensemble.federation.bn_stats import recalibrate_on_probe
from lensemble.federation.global_cache import DIGEST_KEY, keep_global, resolve_global
from lensemble.federation.locks import lock_folder
from lensemble.federation.messages import NodeSpec, Reply
from lensemble.federation.pooling import is_summary_round, pooled_statistics, summary_phase, summary_round
from lensemble.federation.privacy import PrivacyLedger, write_durably
from lensemble.federation.pseudograd import pseudo_gradient
from lensemble.federation.release import participant_pipeline
from lensemble.federation.state import federated_keys, to_tensors
from lensemble.federation.validation import DP_RELEASED_METRICS, check_private_egress
from lensemble.gauge.anchor import FrameAnchor
from lensemble.gauge.backstop import align_and_redifference, backstop_metrics
from lensemble.model.encoder import embed_frames
from lensemble.model.objective import sketch_for_round, sketch_for_step
from lensemble.model.world_model import WorldModel, architecture, world_model_from_state
from lensemble.training.loop import InnerLoop
from lensemble.training.pooling import pools_sigreg

LEDGER_FILE = "dp-ledger.json"


@lru_cache(maxsize=8)
def _silo_sampler(folder: str, silo: int, clip_len: int, block: int) -> ClipSampler:
    # Cached per process: a simulation actor serves many rounds of the same silo.
    return ClipSampler([load_silo(folder, silo, "train")], clip_len, block)


def round_sketch_fn(cfg: LensembleConfig, t: int, site: str):
    """SIGReg sketch schedule inside round t: shared per round (rung >= 2, and whenever SIGReg is
    pooled: the summaries hold for one sketch, the round's) or per-site fresh."""
    d, s = cfg.model.latent_dim, cfg.objective.sigreg_directions
    if cfg.gauge.shared_sketch or pools_sigreg(cfg):
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


OWNER_FILE = "owner.json"


def claim_state_dir(state_dir: Path, run_id: str | None) -> None:
    """Refuse a state folder that holds another run's inner state (``owner.json`` says whose).

    Sequential misuse (a second run pointed at the same ``federation.state_dir`` or SuperNode
    ``state-dir``) would silently load the other run's optimizer state; the folder lock only
    catches runs that overlap in time. Without a run id (an old coordinator) nothing is checked.
    """
    if not run_id:
        return
    path = state_dir / OWNER_FILE
    if path.exists():
        owner = json.loads(path.read_text()).get("run_id")
        if owner != run_id:
            raise FolderInUse(
                f"participant state folder {state_dir} belongs to run {owner}, not to this run ({run_id})",
                remediation="give this run its own federation.state_dir / SuperNode state-dir, "
                            "or delete the old run's state folder")
        return
    path.write_text(json.dumps({"run_id": run_id}) + "\n")


def participant_round(cfg: LensembleConfig, node: NodeSpec, global_arrays: dict[str, np.ndarray],
                      round_config: dict, extras: dict[str, np.ndarray] | None = None) -> Reply:
    """Run one DiLoCo round on one silo and return what may leave it.

    ``round_config`` carries "round", "inner-steps", "probe-hash" and (from the real coordinator)
    "run-id"; ``extras`` carries the public anchor targets ("anchor-targets" (k, d),
    "anchor-idx" (k,)) when the anchor is on. The silo's state folder is locked for the round
    (:func:`~lensemble.federation.locks.lock_folder`): one process at a time trains this silo.
    """
    state_dir = Path(node.state_dir) / node.participant_id
    # Locked per round rather than per process: Ray hands a virtual node's messages to whichever
    # actor (process) is free, so the same silo is served by different processes in turn.
    # A full disk or a read-only state folder fails the round as DiskFull / ReadOnlyFolder, whose
    # fixed cause phrase reaches the coordinator (errors.error_label); EACCES is left alone here,
    # since this block also reads the silo's data (storage_errors, access=False).
    with lock_folder(state_dir, what="participant state folder"), \
            storage_errors(state_dir, "participant state", access=False):
        remove_stale_temps(state_dir)  # what a killed or failed write left, under the lock
        claim_state_dir(state_dir, round_config.get("run-id"))
        # a train ask after a summary ask may send no global: the one kept from the summary ask
        global_arrays = resolve_global(state_dir, round_config, global_arrays)
        return _participant_round(cfg, node, state_dir, global_arrays, round_config, extras)


def round_global(node: NodeSpec, round_config: dict, global_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The round's global arrays for ``node``: as received, or, when the ask sent none and named
    a digest, the ones it kept from the round's summary ask (verified;
    :mod:`lensemble.federation.global_cache`). For adapters that need the global before
    :func:`participant_round` runs (the size a secure participant checks its update against)."""
    state_dir = Path(node.state_dir) / node.participant_id
    if global_arrays or not round_config.get(DIGEST_KEY):
        return global_arrays
    with lock_folder(state_dir, what="participant state folder"):
        claim_state_dir(state_dir, round_config.get("run-id"))
        return dict(resolve_global(state_dir, round_config, global_arrays))


def _participant_round(cfg: LensembleConfig, node: NodeSpec, state_dir: Path, global_arrays: dict[str, np.ndarray],
                       round_config: dict, extras: dict[str, np.ndarray] | None) -> Reply:
    started = time.perf_counter()
    torch.set_num_threads(1)
    t = int(round_config["round"])
    h = int(round_config.get("inner-steps", cfg.federation.inner_steps))
    folder = node.data_path or str(ensure_data(cfg, progress=False)[0])
    probe = probe_frames(folder, str(round_config["probe-hash"]))

    model = world_model_from_state(architecture(cfg.model), to_tensors(global_arrays))
    # The global as the model holds it: a 0-d buffer (BatchNorm's num_batches_tracked) arrives through
    # Flower's ArrayRecord as shape (1,), which load_state_dict accepts but a difference would not.
    global_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if cfg.model.encoder_frozen:
        for p in model.encoder.parameters():
            p.requires_grad_(False)
    anchor = None
    if extras and "anchor-targets" in extras:
        anchor = make_anchor(cfg, model, probe, torch.from_numpy(extras["anchor-targets"]),
                             torch.from_numpy(extras["anchor-idx"]))
    sampler = _silo_sampler(folder, node.partition_id, cfg.train.clip_len, cfg.model.action_block)
    sketch_fn = round_sketch_fn(cfg, t, node.participant_id)
    if is_summary_round(round_config):  # the pooled objective's first ask of the round
        reply = summary_round(cfg, model, sampler, sketch_fn(0), state_dir, node.participant_id, t,
                              summary_phase(round_config), extras)
        keep_global(state_dir, t, global_arrays)  # the train ask sends only its digest
        return reply
    stats = pooled_statistics(cfg, extras, state_dir, node.partition_id, t)
    loop = InnerLoop(model, cfg, sampler, anchor=anchor)
    if (prev := _latest_state(state_dir, t)) is not None:
        loop.load_state_dict(torch.load(prev, weights_only=True))
    reference = embed_frames(model.encoder, probe) if cfg.gauge.backstop else None

    batches = torch_generator(cfg.root_seed, "batches", *batch_labels(cfg.train.replicate), node.participant_id, t)
    last = loop.run(h, sketch_fn=sketch_fn, generator=batches,
                    log_every=h, stats_fn=(lambda i, a: stats) if stats is not None else None)
    # Serialised in memory, then written whole or not at all: torch.save straight to the file left a
    # truncated state on a full disk and reported it as a RuntimeError without the errno.
    buffer = io.BytesIO()
    torch.save(loop.state_dict(), buffer)
    write_bytes_atomic(state_dir / f"inner-after-{t:05d}.pt", buffer.getvalue(), what="inner optimizer state")
    for old in sorted(state_dir.glob("inner-after-*.pt"))[:-2]:
        old.unlink()

    local_sd = {k: v.detach() for k, v in model.state_dict().items()}
    # Statistics from the same public frames as the coordinator's (never from the silo's frames, whose
    # summaries would leave outside the DP pipeline); buffers are not federated, so Δ is unchanged.
    recalibrate_on_probe(model.encoder, probe, cfg)
    local_emb = embed_frames(model.encoder, probe)
    metrics = {k: v for k, v in last.items() if k.startswith("loss/")}
    delta = None
    if cfg.gauge.backstop:
        try:
            # [gauge] Fitted on the probe's landmark frames; what it left is measured on the others.
            split = probe_split_for(cfg, str(round_config["probe-hash"]), len(probe))
            delta, q, residual = align_and_redifference(local_sd, global_sd, local_emb, reference,
                                                        singular_floor=cfg.gauge.singular_floor,
                                                        fit_idx=torch.from_numpy(split.landmark_idx))
            metrics.update(backstop_metrics(local_emb, reference, q, residual, singular_floor=cfg.gauge.singular_floor,
                                            measurement_idx=torch.from_numpy(split.measurement_idx)))
            metrics["gauge/backstop_skipped"] = 0
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
        ledger_path = state_dir / LEDGER_FILE
        if ledger_path.exists():
            ledger.load_state_dict(json.loads(ledger_path.read_text()))
        ledger.check_release()  # raises PrivacyBudgetExceeded before anything is released
        # Recorded (on disk, fsync) before the release exists: a crash after this line costs
        # budget that may not have been spent, never the other way round.
        epsilon = ledger.step()
        write_durably(ledger_path, json.dumps(ledger.state_dict()))
    release = participant_pipeline(delta, clip_norm=priv.clip_norm if priv.enabled else None,
                                   noise_multiplier=priv.noise_multiplier if priv.enabled else 0.0,
                                   quantize=cfg.federation.quantize_int8)
    metrics.update({
        "fed/update_norm": release.norm_before_clip,
        "fed/update_bytes": release.nbytes,
        "fed/inner_steps": h,
        "fed/compute_seconds": time.perf_counter() - started,
        "fed/examples": h * cfg.train.batch_size,
    })
    embeddings = local_emb.numpy().astype(np.float32)
    if priv.enabled:
        # Only the clipped, noised Δ is covered by ε: the probe embeddings, the losses, the
        # pre-clip norm and the backstop fit are functions of the silo's data, so they stay home.
        metrics = {k: v for k, v in metrics.items() if k in DP_RELEASED_METRICS}
        metrics.update({"dp/epsilon": epsilon, "dp/releases": ledger.releases})
        embeddings = np.zeros((0, embeddings.shape[1]), dtype=np.float32)
    reply = Reply(t, release.payload, embeddings, metrics)
    out = reply.egress()
    if priv.enabled:
        check_private_egress(out)
    return reply


__all__ = ["participant_round", "round_global", "round_sketch_fn", "make_anchor", "claim_state_dir", "LEDGER_FILE"]
