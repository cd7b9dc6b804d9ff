"""Reply screening, quorum / retry decisions and the egress allow-list."""

import logging

import numpy as np
import pytest
import torch

from lensemble.errors import FaultToleranceExceeded, ResidencyViolation
from lensemble.federation.codec import encode_delta
from lensemble.federation.validation import (
    Update,
    check_egress,
    check_private_egress,
    require_quorum,
    retry_or_raise,
    validate_updates,
)


def _global() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(3, 2), "b": torch.zeros(4), "count": torch.tensor(1)}


def _delta(value: float = 0.1) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3, 2), value), "b": torch.full((4,), value)}


def test_validate_updates_drops_each_bad_kind_with_a_reason(caplog):
    nan = _delta()
    nan["b"][1] = float("nan")
    updates = [
        Update("ok-fp32", 5, encode_delta(_delta())),
        Update("ok-int8", 5, encode_delta(_delta(-0.3), quantize=True)),
        Update("nan", 5, encode_delta(nan)),
        Update("late", 4, encode_delta(_delta())),
        Update("shape", 5, {"fp32": np.zeros(9, np.float32)}),
        Update("huge", 5, {"fp32": np.zeros(10_000, np.float32)}),  # 40 kB > the 0.01 MiB limit
        Update("junk", 5, {"weights": np.zeros(10, np.float32)}),
        Update("ok-fp32", 5, encode_delta(_delta())),
    ]
    with caplog.at_level(logging.WARNING, logger="lensemble.federation.validation"):
        res = validate_updates(updates, template=_global(), round_index=5, max_update_mb=0.01)
    assert sorted(res.accepted) == ["ok-fp32", "ok-int8"]
    torch.testing.assert_close(res.accepted["ok-fp32"]["w"], _delta()["w"])
    reasons = dict(res.rejected[:-1])
    assert "non-finite" in reasons["nan"]
    assert "wrong round" in reasons["late"]
    assert "wrong shape" in reasons["shape"]
    assert "oversize" in reasons["huge"]
    assert "malformed payload" in reasons["junk"]
    assert res.rejected[-1] == ("ok-fp32", "duplicate reply")
    assert len(caplog.records) == 6


def test_quorum_and_retry_decision():
    require_quorum(2, 2)
    with pytest.raises(FaultToleranceExceeded) as info:
        require_quorum(1, 2, round_index=3)
    err = info.value
    # round_retries=1: the first failure retries, the second stops the run
    assert retry_or_raise(err, attempt=1, round_retries=1) is True
    with pytest.raises(FaultToleranceExceeded):
        retry_or_raise(err, attempt=2, round_retries=1)
    with pytest.raises(FaultToleranceExceeded):
        retry_or_raise(err, attempt=1, round_retries=0)


def test_egress_allows_the_three_named_things():
    check_egress(
        {
            "delta": encode_delta(_delta(), quantize=True),
            "probe_embeddings": np.zeros((8, 4), np.float32),
            "metrics": {"loss": 0.5, "steps": 50, "silo": "a", "aligned": True, "np": np.float64(1.0)},
        }
    )
    check_egress({"delta": encode_delta(_delta())})


@pytest.mark.parametrize(
    "reply",
    [
        {"delta": encode_delta(_delta()), "local_head": np.zeros(3)},
        {"optimizer_state": {}},
        {"metrics": {"loss": torch.tensor(0.5)}},
        {"metrics": {"emb": np.zeros(3)}},
        {"metrics": {"many": [1.0, 2.0]}},
        {"metrics": {"x": np.float32(1.0)}},
        {"delta": dict(encode_delta(_delta()), extra=np.zeros(3, np.float32))},
        {"delta": {"w": torch.zeros(3, 2), "b": torch.zeros(4)}},
        {"probe_embeddings": np.zeros((2, 3, 4))},
    ],
)
def test_egress_refuses_anything_else(reply):
    with pytest.raises(ResidencyViolation):
        check_egress(reply)


def test_bad_probe_embeddings_drop_only_that_reply():
    """Case 4: NaN or wrong-shaped embeddings with a valid delta cost that reply, with a reason."""
    good = np.zeros((8, 4), np.float32)
    nan = good.copy()
    nan[3, 1] = np.nan
    updates = [
        Update("ok", 2, encode_delta(_delta()), good),
        Update("nan", 2, encode_delta(_delta()), nan),
        Update("shape", 2, encode_delta(_delta()), np.zeros((7, 4), np.float32)),
        Update("dtype", 2, encode_delta(_delta()), np.zeros((8, 4), np.int64)),
        Update("missing", 2, encode_delta(_delta()), None),
    ]
    res = validate_updates(updates, template=_global(), round_index=2, max_update_mb=1.0,
                           embedding_shape=(8, 4))
    assert sorted(res.accepted) == ["ok"]
    reasons = dict(res.rejected)
    assert "non-finite" in reasons["nan"]
    assert "(7, 4), expected (8, 4)" in reasons["shape"]
    assert "dtype" in reasons["dtype"] and "not an array" in reasons["missing"]


def test_quorum_error_says_what_happened():
    with pytest.raises(FaultToleranceExceeded) as info:
        require_quorum(0, 1, round_index=2, failures={"silo-1": "did not reply within 5 s",
                                                      "silo-0": "is still busy with round 1; not asked"})
    assert "silo-1 did not reply within 5 s" in info.value.message
    assert "silo-0 is still busy with round 1" in info.value.message


def test_private_egress_allows_only_the_noised_delta_and_counts():
    check_private_egress({"probe_embeddings": np.zeros((0, 4), np.float32),
                          "metrics": {"dp/epsilon": 4.7, "dp/releases": 1, "fed/update_bytes": 120}})
    with pytest.raises(ResidencyViolation, match="embeddings"):
        check_private_egress({"probe_embeddings": np.zeros((8, 4), np.float32), "metrics": {}})
    for leak in ("loss/pred", "fed/update_norm", "gauge/backstop_angle_deg", "fed/compute_seconds"):
        with pytest.raises(ResidencyViolation, match=leak):
            check_private_egress({"probe_embeddings": np.zeros((0, 4), np.float32), "metrics": {leak: 0.1}})
