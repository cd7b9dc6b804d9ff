"""train.precision / eval.precision (lensemble/model/precision.py): known answers.

Covers: the option leaves every fp32 config hash alone; the CPU check reads bf16 matrix units from
the CPU flags; a bf16 request on a machine without them runs fp32 bitwise and says why; bf16 forward
passes are close to fp32 (and really bf16); SIGReg, the pooled statistics, the anchor and every loss
stay fp32 under bf16 autocast; weights, gradients, optimizer state and checkpoints stay fp32; the
evaluation's context runs bf16 inside and nothing after.
"""

import pytest
import torch
from tiny_model import D, frames, tiny_cfg

from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.config.schema import LensembleConfig, ObjectiveConfig, TrainConfig, schema_defaults
from lensemble.eval.mpc import Planner, WorldModelOnDevice
from lensemble.gauge.anchor import FrameAnchor
from lensemble.model import build_world_model
from lensemble.model import precision as prec
from lensemble.model.objective import JEPAObjective
from lensemble.model.pooled import Pooling, ecf_summary, pooled_sigreg
from lensemble.model.precision import (
    Bf16Support,
    PrecisionFallback,
    autocast,
    cpu_bf16_support,
    resolve_precision,
)
from lensemble.model.sigreg import make_sketch, sigreg
from lensemble.training.loop import InnerLoop

HAS = Bf16Support(True, "a test CPU with bf16 matrix units")
HAS_NOT = Bf16Support(False, "a test CPU has no bf16 matrix units")


@pytest.fixture
def with_bf16(monkeypatch):
    monkeypatch.setattr(prec, "bf16_support", lambda device="cpu": HAS)


@pytest.fixture
def without_bf16(monkeypatch):
    monkeypatch.setattr(prec, "bf16_support", lambda device="cpu": HAS_NOT)
    monkeypatch.delenv(prec.FORCE_ENV, raising=False)


def _bf16_exact(*shape, seed=0):
    """Random fp32 values that bf16 represents exactly (so only the arithmetic can differ)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16().float()


# ----------------------------------------------------------------------------------- config
def test_fp32_is_left_out_of_the_dump_and_bf16_is_hashed():
    base = LensembleConfig()
    explicit = LensembleConfig(train=TrainConfig(precision="fp32"), eval={"precision": "fp32"})
    assert "precision" not in base.model_dump()["train"] and "precision" not in base.model_dump()["eval"]
    assert explicit.config_hash() == base.config_hash()
    for section in ("train", "eval"):
        bf16 = LensembleConfig(**{section: {"precision": "bf16"}})
        assert bf16.model_dump()[section]["precision"] == "bf16"
        assert bf16.config_hash() != base.config_hash()
    assert schema_defaults()["train"]["precision"] == schema_defaults()["eval"]["precision"] == "fp32"
    with pytest.raises(Exception, match="precision"):
        LensembleConfig(train={"precision": "fp16"})


# ------------------------------------------------------------------------------- detection
@pytest.mark.parametrize("text,available,named", [
    ("model name\t: Xeon\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n", True, "amx_bf16"),
    ("model name\t: Xeon\nflags\t\t: fpu avx2 avx512f avx512_bf16\n", True, "avx512_bf16"),
    ("processor\t: 0\nFeatures\t: fp asimd sve bf16\n", True, "bf16"),
    ("model name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n", False, "AMD EPYC has no bf16 matrix units"),
])
def test_cpu_support_reads_the_matrix_unit_flags(tmp_path, monkeypatch, text, available, named):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    (tmp_path / "cpuinfo").write_text(text)
    got = cpu_bf16_support(tmp_path / "cpuinfo")
    assert got.available is available and named in got.reason
    assert cpu_bf16_support(tmp_path / "missing").available is False  # no /proc/cpuinfo: no claim


def test_torch_probes_count_when_the_flags_are_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    got = cpu_bf16_support(tmp_path / "missing")
    assert got.available and "amx (torch)" in got.reason


def test_a_bf16_request_without_units_falls_back_to_fp32_and_says_why(without_bf16, monkeypatch):
    with pytest.warns(PrecisionFallback, match=r"train\.precision=bf16 requested but a test CPU has no bf16 "
                                               r"matrix units: running in fp32"):
        assert resolve_precision("bf16", "cpu", field="train.precision") == "fp32"
    monkeypatch.setenv(prec.FORCE_ENV, "1")
    with pytest.warns(PrecisionFallback, match="forced"):
        assert resolve_precision("bf16", "cpu", field="eval.precision") == "bf16"


def test_auto_is_bf16_with_units_and_fp32_without_them_silently(monkeypatch, recwarn):
    monkeypatch.setattr(prec, "bf16_support", lambda device="cpu": HAS)
    assert resolve_precision("auto", field="eval.precision") == "bf16"
    monkeypatch.setattr(prec, "bf16_support", lambda device="cpu": HAS_NOT)
    monkeypatch.setenv(prec.FORCE_ENV, "1")  # forcing is for an explicit bf16 request, not auto
    assert resolve_precision("auto", field="eval.precision") == "fp32"
    assert not [w for w in recwarn if issubclass(w.category, PrecisionFallback)]


def test_a_study_runs_fp32_unless_its_spec_chooses(monkeypatch):
    from lensemble.study.plan import STUDY_PRECISION, pinned_precision
    assert pinned_precision(["data.num_silos=2"]) == [*STUDY_PRECISION, "data.num_silos=2"]
    assert pinned_precision(["eval.precision=bf16"]) == ["train.precision=fp32", "eval.precision=bf16"]
    # the pin moves no hash: fp32 is the value every earlier hash was taken at
    base = LensembleConfig(eval={"precision": "auto"})
    assert "precision" in base.model_dump()["eval"]
    assert LensembleConfig(eval={"precision": "fp32"}).config_hash() == LensembleConfig().config_hash()


def test_fp32_and_supported_bf16_resolve_silently(with_bf16, recwarn):
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"
    assert not [w for w in recwarn if issubclass(w.category, PrecisionFallback)]
    with pytest.raises(ValueError, match="fp16"):
        resolve_precision("fp16")


# ------------------------------------------------------------------------------- training
class _Clips:
    def sample(self, batch_size, generator):
        obs = torch.randint(0, 256, (batch_size, 3, 3, 16, 16), generator=generator, dtype=torch.uint8)
        return type("Clips", (), {"obs": obs, "actions": torch.rand(batch_size, 2, 4, generator=generator)})()


def _cfg(precision: str, **model) -> LensembleConfig:
    return LensembleConfig(model=tiny_cfg(**model), train=TrainConfig(batch_size=8, warmup_steps=0, precision=precision),
                           objective=ObjectiveConfig(sigreg_directions=16, lambda_straight=0.1, lambda_rollout=0.5))


def _train(cfg: LensembleConfig, steps: int = 2):
    model = build_world_model(cfg.model, init_seed=0)
    loop = InnerLoop(model, cfg, _Clips())
    seen = []
    objective = loop.objective

    def spy(*args, **kw):  # what the objective runs under
        seen.append(torch.is_autocast_enabled("cpu"))
        return objective(*args, **kw)

    loop.objective = spy
    sketches = [make_sketch(D, 16, torch.Generator().manual_seed(i)) for i in range(steps)]
    last = loop.run(steps, sketch_fn=lambda i: sketches[i], generator=torch.Generator().manual_seed(0))
    return model, loop, last, seen


def test_bf16_requested_without_units_trains_bitwise_like_fp32(without_bf16):
    ref, _, ref_last, ref_seen = _train(_cfg("fp32"))
    with pytest.warns(PrecisionFallback, match="train.precision"):
        got, loop, last, seen = _train(_cfg("bf16"))
    assert loop.precision == "fp32" and ref_seen == seen == [False, False]  # fp32: no autocast at all
    assert last == ref_last
    for (name, a), b in zip(ref.state_dict().items(), got.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_bf16_training_keeps_fp32_weights_gradients_state_and_checkpoints(with_bf16, tmp_path):
    ref, _, ref_last, _ = _train(_cfg("fp32", projector_norm="batchnorm"))
    model, loop, last, seen = _train(_cfg("bf16", projector_norm="batchnorm"))
    assert loop.precision == "bf16" and seen == [True, True]
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    for state in loop.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in model.state_dict().values() if t.is_floating_point())
    # the same two steps in bf16: close to fp32, not identical (bf16 did run)
    for key in ("loss/pred", "loss/sigreg", "loss/rollout", "loss/straight"):
        assert abs(last[key] - ref_last[key]) <= 0.05 * abs(ref_last[key]) + 1e-4, key
    moved = [float((a - b).detach().abs().max()) for a, b in zip(ref.parameters(), model.parameters(), strict=True)]
    assert max(moved) > 0
    save_checkpoint(tmp_path / "ck", model.state_dict(), kind="world_model")
    assert {t.dtype for t in load_checkpoint(tmp_path / "ck").tensors.values() if t.is_floating_point()} == {torch.float32}


def test_every_loss_term_is_fp32_under_bf16_autocast():
    cfg = _cfg("bf16")
    model = build_world_model(cfg.model, init_seed=0)
    clips = _Clips().sample(8, torch.Generator().manual_seed(1))
    objective = JEPAObjective(cfg.objective, anchor=lambda m: (m.encoder(frames(4)) ** 2).mean(), lambda_anc=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        terms = objective(model, clips.obs, clips.actions, make_sketch(D, 16, torch.Generator().manual_seed(0)))
    assert terms.latents.dtype == torch.bfloat16  # the encoder did run in bf16
    for name in ("total", "pred", "sigreg", "anchor", "straight", "rollout"):
        assert getattr(terms, name).dtype == torch.float32, name


# ------------------------------------------------------------------------- fp32 statistics
def test_sigreg_and_pooled_statistics_are_computed_in_fp32_under_bf16_autocast():
    z, other = _bf16_exact(64, D, seed=1) * 0.5, _bf16_exact(64, D, seed=2)  # 0.5: still exact
    sketch = make_sketch(D, 32, torch.Generator().manual_seed(0))
    summary = ecf_summary(other, sketch)
    pooling = Pooling(parties=2, ecf=summary)
    ref = (sigreg(z, sketch), pooled_sigreg(z, sketch, pooling), ecf_summary(z, sketch).cos)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = (sigreg(z.bfloat16(), sketch), pooled_sigreg(z.bfloat16(), sketch, pooling),
               ecf_summary(z.bfloat16(), sketch).cos)
        bf16_matmul = (z @ sketch).dtype  # what an unguarded statistic would have used
    assert bf16_matmul == torch.bfloat16
    for r, g in zip(ref, got, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", ["A", "B"])
def test_the_anchor_loss_is_fp32_under_bf16_autocast(variant):
    targets, z = _bf16_exact(24, D, seed=3), _bf16_exact(24, D, seed=4)
    anchor = FrameAnchor(targets, torch.arange(24), variant)
    ref = anchor(z)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = anchor(z.bfloat16())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- forward passes
def test_bf16_forward_passes_are_close_to_fp32():
    model = build_world_model(tiny_cfg(), init_seed=0).eval()
    x = frames(16)
    acts = torch.rand(16, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.inference_mode():
        z32 = model.encoder(x)
        r32 = model.predictor.rollout(z32[:, None], acts)
        with autocast("bf16"):
            z16 = model.encoder(x)
            r16 = model.predictor.rollout(z16[:, None], acts)
    assert z16.dtype == r16.dtype == torch.bfloat16
    for a, b in ((z32, z16), (r32, r16)):
        rel = float((b.float() - a).norm() / a.norm())
        assert 0 < rel < 2e-2, rel  # bf16's 8-bit mantissa: ~4e-3 per rounding


def test_attention_leaves_fp32_alone_and_runs_cpu_bf16_in_fp32():
    q, k, v = (_bf16_exact(2, 4, 5, 8, seed=s).requires_grad_() for s in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(prec.attention(q, k, v, is_causal=True), ref)  # fp32: the same call
    qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    with autocast("bf16"):
        out = prec.attention(qb, kb, vb, is_causal=True)
    assert out.dtype == torch.bfloat16
    # exactly fp32 attention on the (exact) bf16 inputs, rounded once: not torch's bf16 kernel
    assert torch.equal(out, ref.detach().bfloat16())
    out.float().sum().backward()
    assert qb.grad.dtype == torch.bfloat16 and bool(qb.grad.abs().sum() > 0)


def test_the_vit_attention_is_timm_attention_bitwise_in_fp32():
    from timm.layers.attention import Attention

    from lensemble.model.vit_layers import ViTAttention
    torch.manual_seed(0)
    ours = ViTAttention(32, num_heads=4)
    torch.manual_seed(0)
    timm_attn = Attention(32, num_heads=4)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), timm_attn.state_dict().values(), strict=True))
    x = torch.randn(3, 17, 32, requires_grad=True)
    y_ours, y_timm = ours(x), timm_attn(x)
    assert torch.equal(y_ours, y_timm)
    g_ours = torch.autograd.grad(y_ours.square().sum(), [x, *ours.parameters()])
    g_timm = torch.autograd.grad(y_timm.square().sum(), [x, *timm_attn.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(g_ours, g_timm, strict=True))
    with autocast("bf16"):
        y16 = ours(x)
    rel = float((y16.float() - y_timm).detach().norm() / y_timm.detach().norm())
    assert y16.dtype == torch.bfloat16 and 0 < rel < 2e-2, rel


def test_the_patch_conv_trains_in_fp32_and_plans_in_bf16_under_autocast():
    from lensemble.model.vit_layers import PatchConv
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 4, stride=4)
    ours = PatchConv.like(conv)
    assert ours.weight is conv.weight and ours.bias is conv.bias  # the same parameters
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(ours(x), conv(x))  # fp32: the plain convolution
    with autocast("bf16"):
        trained = ours(x)  # gradients recorded: fp32
        with torch.no_grad():
            planned = ours(x)  # inference: as autocast leaves it (bf16)
    assert trained.dtype == torch.float32 and torch.equal(trained, conv(x))
    assert planned.dtype == torch.bfloat16
    trained.sum().backward()
    assert conv.weight.grad.dtype == torch.float32


def test_the_evaluation_context_plans_in_bf16_inside_and_fp32_after(with_bf16):
    model = build_world_model(tiny_cfg(), init_seed=0).eval()
    on = WorldModelOnDevice(model, "cpu", "bf16")
    with on:
        assert on.precision == "bf16" and torch.is_autocast_enabled("cpu")
        with torch.inference_mode():
            z = model.encoder(frames(2))
            planner = Planner(horizon=3, num_samples=16, iterations=2, topk=4, action_dim=4)
            res = planner.plan(lambda z0, a: model.predictor.rollout(z0[:, None], a), z.float(), z.flip(0).float())
        assert z.dtype == torch.bfloat16
    on.__exit__(None, None, None)  # evaluate() leaves the block twice: harmless
    assert not torch.is_autocast_enabled("cpu")
    assert res.cost.dtype == res.actions.dtype == torch.float32  # the planner's bookkeeping stays fp32
    assert bool(((res.actions >= -1) & (res.actions <= 1)).all())


def test_the_evaluation_context_falls_back_without_units(without_bf16):
    on = WorldModelOnDevice(build_world_model(tiny_cfg(), init_seed=0), "cpu", "bf16")
    with pytest.warns(PrecisionFallback, match="eval.precision"), on:
        assert not torch.is_autocast_enabled("cpu")
    assert on.precision == "fp32"


def test_emulated_bf16_matmuls_track_torch_bf16_much_closer_than_fp32():
    model = build_world_model(tiny_cfg(), init_seed=0).eval()
    x = frames(16)
    acts = torch.rand(16, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    out = {}
    with torch.inference_mode():
        for name, ctx in (("fp32", prec.nullcontext()), ("bf16", autocast("bf16"))):
            with ctx:
                z = model.encoder(x)
                out[name] = torch.cat([z.float(), model.predictor.rollout(z[:, None], acts).float().flatten(1)], 1)
        with autocast("bf16"), prec.emulate_bf16_matmuls():
            z = model.encoder(x)
            out["emu"] = torch.cat([z.float(), model.predictor.rollout(z[:, None], acts).float().flatten(1)], 1)
    bf16_err = float((out["bf16"] - out["fp32"]).norm() / out["fp32"].norm())
    emu_err = float((out["emu"] - out["bf16"]).norm() / out["fp32"].norm())
    assert emu_err < 0.5 * bf16_err, (emu_err, bf16_err)
    assert float((out["emu"] - out["fp32"]).norm() / out["fp32"].norm()) > 0.5 * bf16_err  # not just fp32
