"""``train_local``: single-site training to a hash-chained checkpoint.

It serves three purposes with one code path: the centralized-pooled baseline (every silo's data
pooled), the local-only baselines (one silo), and the public warm start (the public corpus only).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.artifacts.manifest import build_manifest, write_manifest
from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import batch_labels, derive, torch_generator
from lensemble.errors import ConfigError
from lensemble.model.encoder import recalibrate_batchnorm
from lensemble.model.objective import sketch_for_round, sketch_for_step
from lensemble.model.world_model import architecture, build_world_model, world_model_from_state
from lensemble.observability.metrics import MetricsSink
from lensemble.observability.progress import progress_bar
from lensemble.training.datasets import training_sampler
from lensemble.training.loop import InnerLoop
from lensemble.training.pooling import central_statistics, pools_across_shares, pools_sigreg


def recalibrate_for_checkpoint(model, cfg: LensembleConfig, sampler, source: str, step: int) -> int:
    """Before a checkpoint of a BatchNorm model is saved: re-estimate the running statistics on
    ``cfg.train.bn_recalibration_batches`` fresh training batches of ``sampler`` (0: keep the
    momentum estimates). Returns the number of batches used (0 for a LayerNorm model or a frozen
    encoder).

    The batches come from their own generator, derive(root, "bn-recalibration", source, step),
    so the training batch stream, and with it every parameter, is exactly what it would be
    without recalibration: train-mode BatchNorm normalises with batch statistics, never with the
    running ones.
    """
    n = cfg.train.bn_recalibration_batches
    if n == 0 or cfg.model.encoder_frozen or not model.encoder.batchnorm_layers():
        return 0  # a frozen encoder (Fork A) keeps the statistics it came with
    gen = torch_generator(cfg.root_seed, "bn-recalibration", source, step)
    batches = (sampler.sample(cfg.train.batch_size, gen).obs for _ in range(n))
    return recalibrate_batchnorm(model.encoder, batches)


@dataclass(frozen=True)
class TrainResult:
    """Where a training run left its artifacts and how it ended."""

    run_dir: Path
    checkpoint_dir: Path
    checkpoint_hash: str
    manifest_hash: str
    final_metrics: dict


def train_local(
    cfg: LensembleConfig,
    *,
    source: str = "pooled",
    run_dir: str | Path | None = None,
    init_checkpoint: str | Path | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train one world model on one dataset for ``cfg.train.steps`` optimizer steps.

    Args:
        cfg: the run configuration.
        source: which data: ``"pooled"`` (all silos: centralized baseline), ``"silo-<i>"``
            (local-only baseline for silo i) or ``"public"`` (the public corpus: warm start).
        run_dir: output folder (default ``<cfg.run_dir>/train-<source>``); it receives
            ``checkpoints/``, ``metrics.jsonl``, ``manifest.json`` and ``result.json``.
        init_checkpoint: start from these weights (hash-verified) instead of a fresh init.
        progress: show a progress bar.

    Returns a TrainResult whose checkpoint hash is bitwise reproducible for the same config,
    seed, source and machine.
    """
    torch.set_num_threads(cfg.train.threads)
    run_dir = Path(run_dir or Path(cfg.run_dir) / f"train-{source}")
    run_dir.mkdir(parents=True, exist_ok=True)
    sampler, data_info = training_sampler(cfg, source, progress=progress)

    parent = None
    if init_checkpoint is not None:
        ck = load_checkpoint(init_checkpoint)
        model = world_model_from_state(ck.architecture, ck.tensors)
        if model.encoder.latent_dim != cfg.model.latent_dim:
            raise ConfigError(f"init checkpoint has d={model.encoder.latent_dim}, config says "
                              f"model.latent_dim={cfg.model.latent_dim}")
        parent = ck.content_hash
    else:
        model = build_world_model(cfg.model, init_seed=derive(cfg.root_seed, "init"))
        # A fresh model standardises its input with statistics of the data it trains on (for the
        # warm start: public frames only); a warm-started model keeps the ones it carries. The
        # global input map has nothing to fit.
        if model.encoder.fits_input_statistics:
            model.encoder.fit_input_normalization(sampler.frames)
    if cfg.model.encoder_frozen:
        for p in model.encoder.parameters():
            p.requires_grad_(False)

    kind = "warmstart" if source == "public" else "world_model"
    loop = InnerLoop(model, cfg, sampler)
    generator = torch_generator(cfg.root_seed, "batches", *batch_labels(cfg.train.replicate), source)
    d, n_dir = cfg.model.latent_dim, cfg.objective.sigreg_directions

    stats = central_statistics(cfg, model, sampler, source)
    h = cfg.federation.inner_steps
    pooled_ecf = pools_across_shares(cfg) and pools_sigreg(cfg)

    def sketch(i: int) -> torch.Tensor:
        if pooled_ecf:  # summaries hold for one sketch: one per refresh period, as a round shares one
            return sketch_for_round(cfg.root_seed, i // h, d, n_dir)
        return sketch_for_step(cfg.root_seed, i, d, n_dir, site=source)

    ckpt_root = run_dir / "checkpoints"
    sink = MetricsSink(run_dir / "metrics.jsonl")
    every = cfg.train.checkpoint_every
    last: dict = {}
    started = time.perf_counter()
    label = "warm start" if source == "public" else f"train {source}"
    with progress_bar(label, cfg.train.steps, enabled=progress) as advance:
        step = 0
        while step < cfg.train.steps:
            chunk = min(every or cfg.train.steps, cfg.train.steps - step)

            def on_step(i, metrics, base=step):
                if (base + i + 1) % cfg.train.log_every == 0 or base + i + 1 == cfg.train.steps:
                    sink.log(base + i + 1, metrics)
                advance(1, info=f"pred {metrics['loss/pred']:.3f} sig {metrics['loss/sigreg']:.2f}")

            last = loop.run(chunk, sketch_fn=lambda i, base=step: sketch(base + i), generator=generator,
                            on_step=on_step, log_every=cfg.train.log_every,
                            stats_fn=lambda i, a, base=step: stats(base + i, a))
            step += chunk
            recalibrated = recalibrate_for_checkpoint(model, cfg, sampler, source, step)
            if recalibrated:
                last = {**last, "train/bn_recalibration_batches": recalibrated}
            parent = save_checkpoint(
                ckpt_root / f"step-{step:06d}", model.state_dict(), kind=kind, round_index=step,
                parent_hash=parent, config_hash=cfg.config_hash(), architecture=architecture(cfg.model),
                extra={"source": source, "data": data_info},
            )
    sink.close()
    final_dir = ckpt_root / f"step-{cfg.train.steps:06d}"
    manifest = build_manifest(cfg, f"train:{source}", dataset_hashes={source: data_info.get("shards", [])},
                              probe_hash=data_info.get("probe_hash"))
    write_manifest(manifest, run_dir)
    result = TrainResult(run_dir, final_dir, parent, manifest.manifest_hash(), last)
    (run_dir / "result.json").write_text(json.dumps({
        "checkpoint": str(final_dir), "checkpoint_hash": parent, "manifest_hash": result.manifest_hash,
        "steps": cfg.train.steps, "seconds": round(time.perf_counter() - started, 2), "final_metrics": last,
    }, indent=1, sort_keys=True))
    return result
