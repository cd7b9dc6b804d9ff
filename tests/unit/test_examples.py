"""The example scripts still import and parse their arguments (a renamed module broke the planning
pilot once without any test noticing)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["planning_pilot.py", "central_quality.py"])
def test_example_imports_and_shows_its_help(script):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_pilot_variants_compose_into_valid_configs():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import planning_pilot
    finally:
        sys.path.pop(0)
    from lensemble.config import load_config

    for v in planning_pilot.VARIANTS:
        cfg = load_config(["experiment=micro", *planning_pilot.variant_overrides(v)])
        assert cfg.model.projector_norm in ("layernorm", "batchnorm")
    assert planning_pilot.arm_key("d", 0) == "d" and planning_pilot.arm_key("d", 2) == "d-s2"
    assert planning_pilot.report_stem("strict") == "pilot"
    with pytest.raises(SystemExit):
        planning_pilot.parse_seeds("1,x")
