"""The committed room study's data, collected again here: the same probe, on any x86 CPU.

Known answer: seed 0 of configs/study/region.yaml collected a probe whose content hash the
committed study recorded (docs/results/region/runs/*-s0.json: 67e78ea07a85…). Without MKL's pinned
code path in the collection workers (lensemble/numerics.py), an AVX-512 Intel CPU collects
1391d231… with the same packages; on an AMD CPU the unpinned path happens to agree.
"""

import json
from pathlib import Path

from lensemble.config.loader import load_config
from lensemble.data.store import ensure_data
from lensemble.study.spec import load_study_spec

ROOT = Path(__file__).resolve().parents[2]


def test_room_study_seed0_probe_is_the_committed_one(tmp_path):
    recorded = json.loads((ROOT / "docs/results/region/runs/central-s0.json").read_text())["probe_hash"]
    cfg = load_config([*load_study_spec("region").overrides, "root_seed=0", "eval.seed=0", f"data.root={tmp_path}"])
    _, summary = ensure_data(cfg, progress=False)
    assert summary["probe"]["content_hash"] == recorded
    assert summary["numerics"]["mkl_mode"] in (["COMPATIBLE"], ["no-mkl"])
