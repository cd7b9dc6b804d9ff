"""The inverse-dynamics head under federation, end to end in process (docs/model.md).

Known answers: the head is part of the federated state (the committed global's head moved from
the warm start's), its loss is logged by every participant, and the Procrustes backstop, which
rotates the latent basis of everything else, leaves the head's own weights alone yet keeps its
estimates: the head reads latents through in_proj, which the backstop reparametrises.
"""

import json

import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.federation.inprocess import run_inprocess
from lensemble.model.world_model import world_model_from_state

HEAD = ["model.inverse_head=16", "objective.lambda_inverse=1.0"]


def test_head_federates_and_survives_the_backstop(micro_warm_start, tmp_path):
    base, _, ws_dir = micro_warm_start("fedinv", *HEAD)
    cfg = load_config(base + ["gauge=backstop"])
    summary = run_inprocess(cfg, tmp_path / "run", progress=False)
    final, warm = load_checkpoint(summary["final_checkpoint"]), load_checkpoint(ws_dir)
    head_keys = [k for k in final.tensors if k.startswith("predictor.inverse.")]
    assert head_keys and all(k in warm.tensors for k in head_keys)
    moved = max(float((torch.as_tensor(final.tensors[k]) - torch.as_tensor(warm.tensors[k])).abs().max())
                for k in head_keys)
    assert moved > 1e-5, "the committed global's head is still the warm start's"
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(k.endswith("loss/inverse") for rec in lines for k in rec), "no participant logged the head's loss"
    rounds = [r for r in lines if "gauge/backstop_skipped" in r]
    assert rounds and all(r["gauge/backstop_skipped"] == 0 for r in rounds)
    model = world_model_from_state(final.architecture, final.tensors)
    assert model.predictor.inverse is not None
