"""Known-answer tests: the federated pooled objective is the data-parallel objective of the union batch.

On the real encoder (ViT, BatchNorm projector, frame layer) at test size, C silos each holding one
batch of clips. At a participant's first inner step its live batch is its summary clips, so
every statistic it pools must be the union batch's to float tolerance:

(a) the pooled loss each silo computes equals the union batch's, and so do its latents;
(b) with H = 1 and plain averaging (η = 1, μ = 0) the silos' mean update equals one step of the
    data-parallel twin on the union batch: with a LayerNorm projector, frozen BatchNorm, and pooled
    BatchNorm with the moment-gradient pass (the part of SyncBatchNorm's backward that carries how a
    silo's frames move the *other* silos' outputs through the pooled moments). Without that pass
    the mean update is far from the twin's step, and without the factor C on SIGReg too;
(d) the adversarial case: two silos whose frames differ only in brightness. Summaries encoded
    under the running statistics (the eval-mode shortcut) disagree with the live moments there,
    and the pooled loss is wrong by far more than the tolerance.
"""

from __future__ import annotations

import pytest
import torch
from tiny_model import D, frames, tiny_cfg

from lensemble.config.schema import LensembleConfig, ObjectiveConfig, TrainConfig
from lensemble.data.clips import Clips
from lensemble.model.objective import BatchStatistics, JEPAObjective
from lensemble.model.pooled import SiloSummary, ecf_summary, others_pooling, sum_summaries
from lensemble.model.sigreg import make_sketch
from lensemble.model.world_model import build_world_model
from lensemble.training.pooling import batchnorm_moments, freeze_batchnorm, participant_statistics, silo_poolings

B, K, S = 6, 3, 16


def _cfg(projector_norm="batchnorm", bn_scope="pooled", cross=True):
    # train.batch_size = B: each silo's live batch is its summary clips, as at a first inner step
    return LensembleConfig(model=tiny_cfg(projector_norm=projector_norm), train=TrainConfig(batch_size=B),
                           objective=ObjectiveConfig(sigreg_directions=S, sigreg_scope="pooled", bn_scope=bn_scope,
                                                     bn_cross_gradient=cross))


def _silos(c, brightness=None, seed=0):
    """c silos' clips (B, K, 3, 16, 16) uint8 and actions (B, K-1, 4); ``brightness`` adds a
    per-silo offset to the *same* frames (silos that differ only in brightness)."""
    g = torch.Generator().manual_seed(seed + 100)
    out = []
    for i in range(c):
        base = frames(B * K, seed=seed if brightness is not None else seed + i).reshape(B, K, 3, 16, 16)
        if brightness is not None:
            base = (base.to(torch.int16) // 2 + brightness[i]).clamp(0, 255).to(torch.uint8)
        out.append(Clips(obs=base, actions=torch.randn(B, K - 1, 4, generator=g), state=torch.zeros(B, K, 1)))
    return out


def _freeze(model, cfg):
    if freeze_batchnorm(cfg):  # FixBN, as the inner loop sets it (training/loop.py)
        for bn in model.encoder.batchnorm_layers():
            bn.eval()


def _model(cfg, seed=0):
    model = build_world_model(cfg.model, init_seed=seed)
    model.train()
    _freeze(model, cfg)
    return model


def _silo_stats(model, cfg, silos, sketch):
    poolings = silo_poolings(model, silos, sketch, cfg)
    _freeze(model, cfg)  # summarise restores train mode, as a participant's inner loop does before its steps
    return [participant_statistics(p) for p in poolings]


def _union(silos):
    return torch.cat([x.obs for x in silos]), torch.cat([x.actions for x in silos])


@pytest.mark.parametrize("c", [2, 4])
def test_a_silos_pooled_loss_at_step_0_is_the_union_batchs(c):
    cfg = _cfg()
    model = _model(cfg)
    sketch = make_sketch(D, S, torch.Generator().manual_seed(1))
    objective = JEPAObjective(cfg.objective)
    silos = _silos(c)
    stats = _silo_stats(model, cfg, silos, sketch)
    obs_u, act_u = _union(silos)
    union = objective(model, obs_u, act_u, sketch)
    for i, (x, st) in enumerate(zip(silos, stats, strict=True)):
        obs, act = x.obs, x.actions
        terms = objective(model, obs, act, sketch, st)
        torch.testing.assert_close(terms.latents, union.latents[i * B:(i + 1) * B], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(terms.sigreg, union.sigreg, rtol=1e-4, atol=1e-4)
    # the prediction terms average to the union's (equal shares)
    preds = torch.stack([objective(model, x.obs, x.actions, sketch, st).pred for x, st in zip(silos, stats, strict=True)])
    torch.testing.assert_close(preds.mean(), union.pred, rtol=1e-4, atol=1e-6)


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _mean_update_and_twin_step(cfg, c, lr=0.1):
    """(mean of the C silos' one-step SGD updates, the twin's one SGD step on the union batch),
    flattened over the parameters, from the same model (H = 1, η = 1, μ = 0)."""
    model = _model(cfg)
    sketch = make_sketch(D, S, torch.Generator().manual_seed(1))
    objective = JEPAObjective(cfg.objective)
    silos = _silos(c)
    stats = _silo_stats(model, cfg, silos, sketch)
    per_silo = [_grads(model, objective(model, x.obs, x.actions, sketch, st).total) for x, st in zip(silos, stats, strict=True)]
    obs_u, act_u = _union(silos)
    twin = _grads(model, objective(model, obs_u, act_u, sketch).total)
    names = sorted(twin)
    fed = torch.cat([-lr * torch.stack([g[n] for g in per_silo]).mean(0).flatten() for n in names])
    ref = torch.cat([-lr * twin[n].flatten() for n in names])
    return fed, ref


@pytest.mark.parametrize("norm,scope", [("layernorm", "batch"), ("batchnorm", "frozen"), ("batchnorm", "pooled")])
def test_b_the_mean_update_is_one_twin_step(norm, scope):
    cfg = _cfg(projector_norm=norm, bn_scope=scope)
    for c in (2, 4):
        fed, ref = _mean_update_and_twin_step(cfg, c)
        torch.testing.assert_close(fed, ref, rtol=1e-3, atol=1e-6)


def test_b_without_the_moment_gradients_or_the_factor_c_the_mean_update_is_not_the_twins():
    fed, ref = _mean_update_and_twin_step(_cfg(cross=False), 2)
    rel_local = float((fed - ref).norm() / ref.norm())
    assert rel_local > 0.5, rel_local  # 3.4 on this model: the cross-silo moment path is most of the step
    # the factor C on SIGReg: without it the federation descends λ_sig·SIGReg / C (LayerNorm: no moment path)
    cfg = _cfg(projector_norm="layernorm", bn_scope="batch")
    model = _model(cfg)
    sketch = make_sketch(D, S, torch.Generator().manual_seed(1))
    objective = JEPAObjective(cfg.objective)
    silos = _silos(2)
    unweighted = [BatchStatistics(pooling=st.pooling) for st in _silo_stats(model, cfg, silos, sketch)]
    per_silo = [_grads(model, objective(model, x.obs, x.actions, sketch, st).total) for x, st in zip(silos, unweighted,
                                                                                                   strict=True)]
    obs_u, act_u = _union(silos)
    twin = _grads(model, objective(model, obs_u, act_u, sketch).total)
    names = sorted(twin)
    weak = torch.cat([torch.stack([g[n] for g in per_silo]).mean(0).flatten() for n in names])
    ref = torch.cat([twin[n].flatten() for n in names])
    assert float((weak - ref).norm() / ref.norm()) > 0.01


def test_d_brightness_silos_fool_eval_mode_summaries_not_the_consistent_ones():
    cfg = _cfg()
    model = _model(cfg)
    sketch = make_sketch(D, S, torch.Generator().manual_seed(1))
    objective = JEPAObjective(cfg.objective)
    silos = _silos(2, brightness=(0, 120))  # the same scenes, one silo far brighter
    obs_u, act_u = _union(silos)
    # the running statistics are those of some other frames (a probe, a warm start): here the dark silo's
    enc = model.encoder
    layer = enc.batchnorm_layers()[0]
    [m] = batchnorm_moments(model, silos[0].obs)
    layer.running_mean.copy_(m.mean)
    layer.running_var.copy_(m.var)
    union = objective(model, obs_u, act_u, sketch)

    # consistent (two passes): every silo's pooled SIGReg is the union's
    for x, st in zip(silos, _silo_stats(model, cfg, silos, sketch), strict=True):
        torch.testing.assert_close(objective(model, x.obs, x.actions, sketch, st).sigreg, union.sigreg,
                                   rtol=1e-4, atol=1e-4)

    # the eval-mode shortcut: ECF of latents normalised by the running statistics
    def eval_mode(obs):
        enc.eval()
        with torch.no_grad():
            z = enc.encode_frames(obs)
        enc.train()
        return SiloSummary(ecf_summary(z, sketch), batchnorm_moments(model, obs))

    own = [eval_mode(x.obs) for x in silos]
    mean = sum_summaries(own).scaled(0.5)
    wrong = [objective(model, x.obs, x.actions, sketch, BatchStatistics(pooling=(others_pooling(mean, o, 2),),
                                                                        sigreg_weight=2.0)).sigreg
             for x, o in zip(silos, own, strict=True)]
    gaps = [abs(float(w - union.sigreg)) / float(union.sigreg) for w in wrong]
    assert min(gaps) > 0.05, gaps
