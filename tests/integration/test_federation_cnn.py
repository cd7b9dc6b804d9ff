"""The CNN backbone under federation, end to end in process (docs/model.md, encoder backbone).

Known answers: the backbone's weights are federated state (the committed global's convolutions
moved from the warm start's), the Procrustes backstop runs on it (it rotates only ``frame``,
after the backbone), and the final checkpoint rebuilds a CNN encoder whose latents match the
checkpoint's own embedding of the same frames.
"""

import json

import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.federation.inprocess import run_inprocess
from lensemble.model.world_model import world_model_from_state

CNN = ["model.backbone=cnn", "model.cnn_channels=[4,8]"]


def test_cnn_backbone_federates_under_the_backstop(micro_warm_start, tmp_path):
    base, _, ws_dir = micro_warm_start("fedcnn", *CNN)
    cfg = load_config(base + ["gauge=backstop"])
    summary = run_inprocess(cfg, tmp_path / "run", progress=False)
    final, warm = load_checkpoint(summary["final_checkpoint"]), load_checkpoint(ws_dir)
    conv_keys = [k for k in final.tensors if k.startswith("encoder.cnn.")]
    assert conv_keys and not any(k.startswith("encoder.vit.") for k in final.tensors)
    moved = max(float((torch.as_tensor(final.tensors[k]) - torch.as_tensor(warm.tensors[k])).abs().max())
                for k in conv_keys)
    assert moved > 1e-5, "the committed global's backbone is still the warm start's"
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in lines if "gauge/backstop_skipped" in r]
    assert rounds and all(r["gauge/backstop_skipped"] == 0 for r in rounds)
    model = world_model_from_state(final.architecture, final.tensors).eval()
    assert model.encoder.backbone_kind == "cnn"
    x = torch.randint(0, 256, (3, 3, cfg.model.img_size, cfg.model.img_size), dtype=torch.uint8)
    with torch.no_grad():
        z = model.encoder(x)
    assert z.shape == (3, cfg.model.latent_dim) and torch.isfinite(z).all()
