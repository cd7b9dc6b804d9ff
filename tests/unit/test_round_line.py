"""The per-round progress line reports drift in the variance-weighted measure (issue 32, item 4)."""

from lensemble.federation.rounds import Answers, _round_line


def test_round_line_reports_the_subspace_angle_not_the_full_space_one():
    answers = Answers(replies={"silo-0": object(), "silo-1": object()}, asked=2, wire_bytes=10_000_000)
    metrics = {"gauge/drift_angle_deg": 424.6, "gauge/drift_subspace_angle_deg": 22.04, "loss/pred": 0.19}
    line = _round_line(0, 3, 1, answers, metrics, 36.3, 2)
    assert "drift 22.0° (95 %-energy subspace)" in line
    assert "424.6" not in line
    # without a drift report (DP: no participant embeddings) the line says nothing about drift
    assert "drift" not in _round_line(0, 3, 1, answers, {"gauge/drift_angle_deg": 1.0}, 1.0, 2)
