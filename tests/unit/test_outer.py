"""Outer step, deterministic aggregation and pseudo-gradients (DESIGN §4)."""

import itertools

import pytest
import torch

from lensemble.errors import ConfigError, NonDeterministicAggregation, RoundError
from lensemble.federation import outer as outer_mod
from lensemble.federation.outer import OuterOptimizer, aggregate, aggregate_checked, state_digest
from lensemble.federation.pseudograd import Layout, flatten, l2_norm, pseudo_gradient, unflatten


def _model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "enc.w": torch.randn(4, 3, generator=g),
        "enc.b": torch.randn(4, generator=g),
        "pred.w": torch.randn(2, 4, generator=g),
    }


def _deltas(n: int, base_seed: int = 100) -> dict[str, dict[str, torch.Tensor]]:
    glob = _model(0)
    return {f"silo-{i}": pseudo_gradient(_model(base_seed + i), glob) for i in range(n)}


# -- pseudo-gradients -----------------------------------------------------------------------------


def test_pseudo_gradient_is_local_minus_global_fp32_sorted():
    loc, glo = _model(1), _model(0)
    d = pseudo_gradient(loc, glo)
    assert list(d) == sorted(glo)
    for k in glo:
        assert d[k].dtype == torch.float32
        torch.testing.assert_close(d[k], loc[k] - glo[k])


def test_pseudo_gradient_rejects_shape_and_key_mismatch():
    glo = _model(0)
    bad = dict(glo, **{"enc.b": torch.zeros(5)})
    with pytest.raises(RoundError):
        pseudo_gradient(bad, glo)
    with pytest.raises(RoundError):
        pseudo_gradient({k: v for k, v in glo.items() if k != "enc.b"}, glo)


def test_pseudo_gradient_skips_integer_buffers():
    glo = dict(_model(0), steps=torch.tensor(3))
    loc = dict(_model(1), steps=torch.tensor(7))
    assert "steps" not in pseudo_gradient(loc, glo)


def test_flatten_roundtrip_and_norm():
    sd = _model(3)
    flat, layout = flatten(sd)
    assert layout == Layout.of(sd) and layout.names == tuple(sorted(sd))
    assert flat.shape == (layout.numel,) == (4 * 3 + 4 + 2 * 4,)
    back = unflatten(flat, layout)
    for k in sd:
        assert torch.equal(back[k], sd[k])
    assert l2_norm(sd) == pytest.approx(float(flat.double().norm()), rel=1e-12)


# -- aggregation ----------------------------------------------------------------------------------


def test_aggregate_is_the_mean():
    deltas = _deltas(3)
    mean = aggregate(deltas)
    for k in mean:
        ref = torch.stack([d[k].double() for d in deltas.values()]).mean(0).float()
        torch.testing.assert_close(mean[k], ref, rtol=0, atol=1e-7)


def test_aggregate_is_bitwise_independent_of_arrival_order():
    deltas = _deltas(4)
    ref = state_digest(aggregate(deltas))
    for perm in itertools.permutations(deltas):
        shuffled = {pid: deltas[pid] for pid in perm}
        assert state_digest(aggregate(shuffled)) == ref


def test_aggregate_rejects_mismatched_layout_and_empty():
    deltas = _deltas(2)
    deltas["silo-1"] = dict(deltas["silo-1"], **{"enc.b": torch.zeros(())})  # a scalar must not broadcast
    with pytest.raises(RoundError):
        aggregate(deltas)
    with pytest.raises(RoundError):
        aggregate({})


def test_aggregate_checked_detects_nondeterminism(monkeypatch):
    deltas = _deltas(2)
    assert state_digest(aggregate_checked(deltas)) == state_digest(aggregate(deltas))

    calls = itertools.count()
    real = outer_mod.aggregate

    def flaky(d):
        out = real(d)
        if next(calls) % 2:
            out["enc.b"] = out["enc.b"] + 1e-3
        return out

    monkeypatch.setattr(outer_mod, "aggregate", flaky)
    with pytest.raises(NonDeterministicAggregation):
        outer_mod.aggregate_checked(deltas)


# -- outer step -----------------------------------------------------------------------------------


def test_sign_eta1_mu0_gives_mean_of_locals():
    """The sign check: with η=1, μ=0 the new global is the mean of the local models."""
    glo = _model(0)
    locals_ = {f"silo-{i}": _model(10 + i) for i in range(3)}
    mean_delta = aggregate({pid: pseudo_gradient(loc, glo) for pid, loc in locals_.items()})
    for nesterov in (True, False):
        opt = OuterOptimizer(glo, lr=1.0, momentum=0.0, nesterov=nesterov)
        new = opt.commit(mean_delta)
        for k in glo:
            mean_local = torch.stack([loc[k] for loc in locals_.values()]).mean(0)
            torch.testing.assert_close(new[k], mean_local, rtol=0, atol=1e-6)


def test_momentum_matches_hand_computation_over_three_rounds():
    theta0 = torch.tensor([1.0, -2.0])
    d = [torch.tensor([0.5, 0.25]), torch.tensor([-1.0, 2.0]), torch.tensor([0.125, 0.0])]
    lr, mu = 0.7, 0.9
    for nesterov in (True, False):
        opt = OuterOptimizer({"w": theta0}, lr=lr, momentum=mu, nesterov=nesterov)
        theta, v = theta0.double().tolist(), [0.0, 0.0]
        for dt in d:
            got = opt.commit({"w": dt})["w"]
            dl = dt.double().tolist()
            v = [mu * vi + di for vi, di in zip(v, dl, strict=True)]
            step = [di + mu * vi for di, vi in zip(dl, v, strict=True)] if nesterov else v
            theta = [
                float(torch.tensor(ti + lr * si, dtype=torch.float64).float())
                for ti, si in zip(theta, step, strict=True)
            ]
            assert got.tolist() == pytest.approx(theta, abs=1e-6)
            assert opt.velocity["w"].tolist() == pytest.approx(v, abs=1e-12)
    # first Nesterov round by hand: v = 0.5, θ = 1 + 0.7·(0.5 + 0.9·0.5) = 1.665
    opt = OuterOptimizer({"w": theta0}, lr=lr, momentum=mu)
    assert float(opt.commit({"w": d[0]})["w"][0]) == pytest.approx(1.665, abs=1e-6)


def test_preview_is_pure_and_commit_matches_it():
    glo = _model(0)
    opt = OuterOptimizer(glo)
    d1 = aggregate(_deltas(3))
    opt.commit(d1)
    before_params, before_v = state_digest(opt.params), state_digest(opt.velocity)
    d2 = aggregate(_deltas(3, base_seed=200))
    p1 = opt.preview(d2)
    p2 = opt.preview(d2)
    assert state_digest(p1) == state_digest(p2)
    assert state_digest(opt.params) == before_params
    assert state_digest(opt.velocity) == before_v
    assert opt.steps == 1
    committed = opt.commit(d2, expected=p1)
    assert state_digest(committed) == state_digest(p1)
    # a commit that disagrees with the checkpointed preview must not advance the state
    with pytest.raises(NonDeterministicAggregation):
        opt.commit(d2, expected=p1)
    assert state_digest(opt.params) == state_digest(committed)


def test_resume_from_state_dict_is_bitwise_identical():
    rounds = [aggregate(_deltas(3, base_seed=100 * r)) for r in range(1, 5)]
    a = OuterOptimizer(_model(0))
    for d in rounds[:2]:
        a.commit(d)
    b = OuterOptimizer(a.params)  # params come from the checkpoint, velocity from state_dict
    b.load_state_dict(a.state_dict())
    assert b.steps == 2
    for d in rounds[2:]:
        assert state_digest(a.commit(d)) == state_digest(b.commit(d))
    assert state_digest(a.velocity) == state_digest(b.velocity)

    c = OuterOptimizer(a.params, lr=0.5)
    with pytest.raises(ConfigError):
        c.load_state_dict(a.state_dict())


def test_outer_step_rejects_wrong_shapes_and_keeps_int_buffers():
    glo = dict(_model(0), steps=torch.tensor(5))
    opt = OuterOptimizer(glo)
    good = aggregate(_deltas(2))
    with pytest.raises(RoundError):
        opt.preview(dict(good, **{"enc.w": torch.zeros(())}))
    with pytest.raises(RoundError):
        opt.preview(dict(good, steps=torch.zeros(())))
    new = opt.commit(good)
    assert torch.equal(new["steps"], torch.tensor(5))
    assert new["enc.w"].dtype == torch.float32


def test_one_round_in_process_participant_to_server():
    """Pipeline → egress check → validation → checked mean → outer step, all without Flower."""
    from lensemble.federation.codec import payload_nbytes
    from lensemble.federation.release import participant_pipeline
    from lensemble.federation.validation import Update, check_egress, require_quorum, validate_updates

    glo = _model(0)
    locals_ = {f"silo-{i}": _model(10 + i) for i in range(3)}
    updates = []
    for pid, loc in locals_.items():
        rel = participant_pipeline(pseudo_gradient(loc, glo), quantize=True)
        reply = {"delta": rel.payload, "metrics": {"nbytes": payload_nbytes(rel.payload)}}
        check_egress(reply)
        updates.append(Update(pid, 0, reply["delta"]))
    res = validate_updates(updates, template=glo, round_index=0, max_update_mb=1.0)
    require_quorum(len(res.accepted), 2)
    new = OuterOptimizer(glo, lr=1.0, momentum=0.0).commit(aggregate_checked(res.accepted))
    for k in glo:
        mean_local = torch.stack([loc[k] for loc in locals_.values()]).mean(0)
        # int8 error per coordinate ≤ max|Δ|/254 ≤ ~0.05 here
        torch.testing.assert_close(new[k], mean_local, rtol=0, atol=0.05)


def test_the_outer_step_is_divided_by_the_best_response_overshoot():
    from lensemble.federation.outer import outer_step_size

    assert outer_step_size(0.7, 4, None) == 0.7  # no κ: as given
    assert outer_step_size(1.0, 2, 1.0) == 0.5 and outer_step_size(1.0, 8, 1.0) == 0.125  # κ = 1: 1/C
    assert outer_step_size(1.0, 8, 0.0) == 1.0  # updates that move only their own silo: no overshoot
    assert abs(outer_step_size(1.0, 4, 0.5) - 0.4) < 1e-12
    with pytest.raises(ConfigError):
        outer_step_size(1.0, 2, 1.5)
