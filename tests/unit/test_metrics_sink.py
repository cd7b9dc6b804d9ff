import numpy as np
import pytest
import torch

from lensemble.errors import ResidencyViolation
from lensemble.observability.metrics import MetricsSink, read_metrics


def test_writes_scalars_as_jsonl(tmp_path):
    with MetricsSink(tmp_path / "m.jsonl") as sink:
        sink.log(1, {"loss/pred": 0.5, "fed/participants": 2, "eval/success_rate": np.float32(0.25)})
        sink.log(2, {"gauge/drift_angle_deg": float("nan")}, round=2)
    rows = read_metrics(tmp_path / "m.jsonl")
    assert rows[0]["loss/pred"] == 0.5 and rows[0]["fed/participants"] == 2
    assert rows[0]["eval/success_rate"] == pytest.approx(0.25)
    assert rows[1]["gauge/drift_angle_deg"] == "nan" and rows[1]["round"] == 2


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.tensor([[1.0]]), np.zeros(2), [1.0, 2.0], {"a": 1}, b"raw"])
def test_refuses_tensors_arrays_and_containers(tmp_path, bad):
    sink = MetricsSink(tmp_path / "m.jsonl")
    with pytest.raises(ResidencyViolation):
        sink.log(0, {"loss/pred": bad})
    sink.close()
    assert read_metrics(tmp_path / "m.jsonl") == []


def test_refuses_unknown_family_and_long_strings(tmp_path):
    sink = MetricsSink(tmp_path / "m.jsonl")
    with pytest.raises(ResidencyViolation):
        sink.log(0, {"secret/embedding": 1.0})
    with pytest.raises(ResidencyViolation):
        sink.log(0, {"note": "x" * 1000})
    sink.close()
