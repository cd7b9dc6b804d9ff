"""Wire codec: fp32 / int8 payloads, size accounting and the int8 error bound."""

import math

import numpy as np
import pytest
import torch

from lensemble.errors import RoundError
from lensemble.federation.codec import (
    decode_delta,
    dequantize_int8,
    encode_delta,
    payload_nbytes,
    quant_ratio,
    quantize_int8,
)
from lensemble.federation.pseudograd import Layout


def _delta(seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "b": torch.randn(7, generator=g) * scale,
        "a.w": torch.randn(5, 3, generator=g) * scale,
    }


def test_fp32_roundtrip_is_exact():
    d = _delta()
    payload = encode_delta(d)
    assert set(payload) == {"fp32"} and payload["fp32"].dtype == np.float32
    back = decode_delta(payload, Layout.of(d))
    assert list(back) == sorted(d)
    for k in d:
        assert torch.equal(back[k], d[k])
    assert payload_nbytes(payload) == 4 * 22
    assert quant_ratio(payload) == 1.0


@pytest.mark.parametrize("seed,scale", [(0, 1.0), (1, 1e-4), (2, 3e3)])
def test_int8_error_bound_and_size(seed, scale):
    d = _delta(seed, scale)
    n = 22
    payload = encode_delta(d, quantize=True)
    assert payload["q"].dtype == np.int8 and payload["q"].shape == (n,)
    assert payload["scale"].dtype == np.float32 and payload["scale"].shape == (1,)
    assert payload_nbytes(payload) == n + 4
    assert quant_ratio(payload) == pytest.approx(4 * n / (n + 4))

    back = decode_delta(payload, Layout.of(d))
    flat = torch.cat([d[k].reshape(-1) for k in sorted(d)]).double()
    flat_hat = torch.cat([back[k].reshape(-1) for k in sorted(d)]).double()
    peak = float(flat.abs().max())
    err = float((flat - flat_hat).norm())
    # tiny relative slack for fp32 rounding of the scale and of q·scale
    assert err <= math.sqrt(n) * peak / 254 * (1 + 1e-5)
    assert float((flat - flat_hat).abs().max()) <= peak / 254 * (1 + 1e-5)


def test_int8_extremes_and_zero():
    q, scale = quantize_int8(torch.tensor([-2.0, 0.0, 1.0, 2.0]))
    assert q.tolist() == [-127, 0, 64, 127]
    assert scale == np.float32(2.0 / 127)
    q0, s0 = quantize_int8(torch.zeros(4))
    assert s0 == np.float32(1.0) and not q0.any()
    assert dequantize_int8(q0, s0).tolist() == [0.0] * 4


def test_int8_refuses_non_finite():
    with pytest.raises(RoundError):
        quantize_int8(torch.tensor([1.0, float("nan")]))


def test_decode_rejects_malformed_payloads():
    layout = Layout.of(_delta())
    with pytest.raises(RoundError):
        decode_delta({"fp32": np.zeros(21, np.float32)}, layout)
    with pytest.raises(RoundError):
        decode_delta({"fp32": np.zeros(22, np.float64)}, layout)
    with pytest.raises(RoundError):
        decode_delta({"q": np.zeros(22, np.int8)}, layout)
    with pytest.raises(RoundError):
        decode_delta({"fp32": np.zeros(22, np.float32), "extra": np.zeros(1)}, layout)
