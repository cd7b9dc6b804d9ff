"""Which engine a study's federated run goes through (lensemble/study/runner.py: study_engine)."""

from __future__ import annotations


def test_secure_aggregation_runs_go_through_flower_the_rest_through_the_inprocess_engine():
    # The pooled-sweeps study's SecAgg+ runs failed on the in-process engine, which refuses them.
    from lensemble.config import load_config
    from lensemble.federation.simulation import ENGINES
    from lensemble.study.runner import study_engine

    assert study_engine(load_config(["experiment=micro"])) == "inprocess"
    secagg = load_config(["experiment=micro", "federation.secure_aggregation=true"])
    assert study_engine(secagg) == "flower-inprocess" and "flower-inprocess" in ENGINES
