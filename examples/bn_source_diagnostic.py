"""Which BatchNorm statistics does a federated model plan with? A diagnostic for the room study.

Under federation every party re-estimates the encoder's BatchNorm statistics on the *public probe*
(``federation.bn_recalibration=probe``, :mod:`lensemble.federation.bn_stats`): no statistic of a
silo's frames is released. In the room study the probe is cut from the public corpus, the band
around the door, while every evaluation task starts in a room, so a federated model may normalise
room frames with door-band statistics, which a centralized or local model (recalibrated on its own
training frames) never does. This script separates that from the averaging itself: it takes a
finished federated run of a study, re-estimates only the BatchNorm running statistics on
``--source`` training batches (default ``pooled``: every silo's frames, the statistics a central
model would have, re-estimated the way ``train_local`` does before saving; the weights stay
bitwise the same), and scores both the original and the
recalibrated model on the run's own evaluation tasks (``eval.seed`` = the run's seed: the tasks
of the study's summary).

Descriptive, outside the registry: the recalibrated model reads silo frames, which no federated
party may do, so it is not an arm of the study. It says how much of an arm's planning the
statistics alone cost.

    .venv/bin/python examples/bn_source_diagnostic.py --study region --run naive-s0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.config.loader import load_config
from lensemble.eval.closed_loop import evaluate
from lensemble.eval.stats import wilson_interval
from lensemble.model.world_model import architecture, world_model_from_state
from lensemble.training.datasets import training_sampler
from lensemble.training.trainer import recalibrate_for_checkpoint


def final_model_dir(run_dir: Path) -> Path:
    rounds = sorted((run_dir / "rounds").glob("round-*"))
    if not rounds:
        raise SystemExit(f"{run_dir} has no rounds/round-*/model: is it a finished federated run?")
    return rounds[-1] / "model"


def recalibrated_copy(src: Path, dst: Path, cfg, source: str) -> tuple[Path, int]:
    """``src``'s weights with BatchNorm statistics re-estimated exactly as ``train_local`` does
    before it saves (:func:`lensemble.training.trainer.recalibrate_for_checkpoint`:
    ``train.bn_recalibration_batches`` batches of ``source``), written to ``dst``; no weight
    changes (checked). Returns the folder and the number of buffers that moved."""
    ckpt = load_checkpoint(src)
    model = world_model_from_state(ckpt.header["architecture"], ckpt.tensors)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sampler, _ = training_sampler(cfg, source, progress=False)
    used = recalibrate_for_checkpoint(model, cfg, sampler, source, step=0)
    after = model.state_dict()
    moved = [k for k in after if not torch.equal(after[k], before[k])]
    if any("running" not in k and "num_batches" not in k for k in moved):
        raise AssertionError(f"recalibration changed weights, not only statistics: {moved[:4]}")
    save_checkpoint(dst, after, kind="bn-diagnostic", parent_hash=ckpt.header["content_hash"],
                    config_hash=cfg.config_hash(), architecture=architecture(cfg.model),
                    extra={"bn_source": source, "batches": used})
    return dst, len(moved)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="region")
    ap.add_argument("--run", default="naive-s0", help="a finished federated run of the study")
    ap.add_argument("--results", default="docs/results", help="where the study's summaries are")
    ap.add_argument("--scratch", default=None, help="the study's scratch folder (default runs/study/<study>)")
    ap.add_argument("--source", default="pooled", help="training frames for the statistics: pooled or silo-<i>")
    ap.add_argument("--out", default=None, help="write the result here (JSON)")
    args = ap.parse_args(argv)
    summary = json.loads((Path(args.results) / args.study / "runs" / f"{args.run}.json").read_text())
    if summary.get("kind") != "federated":
        raise SystemExit(f"{args.run} is a {summary.get('kind')} run; this diagnostic is for federated runs")
    scratch = Path(args.scratch or f"runs/study/{args.study}") / args.run
    cfg = load_config(list(summary["overrides"]) + [f"run_dir={scratch}"])
    src = final_model_dir(scratch)
    if load_checkpoint(src).header["content_hash"] != summary["checkpoint_hash"]:
        raise SystemExit(f"{src} is not the checkpoint the summary recorded")
    dst, n_moved = recalibrated_copy(src, scratch / "bn-diagnostic" / args.source, cfg, args.source)
    rows = {}
    for label, folder in (("as trained (probe statistics)", src), (f"statistics from {args.source}", dst)):
        rep = evaluate(folder, cfg.env.id, cfg=cfg, ladder=False, progress=False,
                       parallel=8, episodes=cfg.eval.episodes)
        ci = wilson_interval(rep.n_successes, rep.n_episodes)
        lo, hi = ci.low, ci.high
        rows[label] = {"successes": rep.n_successes, "episodes": rep.n_episodes, "rate": rep.success_rate,
                       "wilson_95": [lo, hi], "goal_spec_hash": rep.goal_spec_hash}
        print(f"{args.run} {label:34s} {rep.n_successes}/{rep.n_episodes} = {rep.success_rate:.2f} "
              f"[{lo:.2f}, {hi:.2f}]", flush=True)
    recorded = summary["eval"]["success_rate"]
    print(f"the study's summary recorded {recorded:.2f} on the same tasks; {n_moved} BatchNorm buffers moved")
    if args.out:
        Path(args.out).write_text(json.dumps({"run": args.run, "source": args.source,
                                              "batches": cfg.train.bn_recalibration_batches,
                                              "recorded": recorded, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
