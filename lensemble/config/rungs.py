"""The ablation ladder's rung table: rung name -> the gauge flags that define it.

This table is the one definition of what each rung switches on. The schema takes its rung names
and its default gauge (the first rung's flags) from it; each Hydra group file
``configs/gauge/<rung>.yaml`` writes only the rung's flags that differ from that default (a
parametrized test composes each file and compares with this table); the study, its registry and
its report read the rung order from here. The rungs are additive (DESIGN.md §5): each keeps the previous
rung's controls and adds one.
"""

from __future__ import annotations

from types import MappingProxyType

# Flags not named here keep the schema's defaults (GaugeConfig): e.g. anchor_landmarks, the
# distillation step size, the Procrustes singular-value floor.
_FLAGS = {
    # 1: no gauge control at all; each participant draws its own SIGReg sketch every step
    "naive": {"shared_sketch": False, "backstop": False, "anchor": "none", "lambda_anc": 0.0, "distill": False},
    # 2: + one SIGReg sketch per round shared by every participant
    "sketch": {"shared_sketch": True, "backstop": False, "anchor": "none", "lambda_anc": 0.0, "distill": False},
    # 3: + Procrustes align-then-average on the participant (an exact reparametrisation)
    "backstop": {"shared_sketch": True, "backstop": True, "anchor": "none", "lambda_anc": 0.0, "distill": False},
    # 4: + frame-anchor loss, variant A (landmark MSE to the frozen warm start) at weight 1
    "anchor": {"shared_sketch": True, "backstop": True, "anchor": "A", "lambda_anc": 1.0, "distill": False},
    # 5: + server-side function-space distillation toward the aligned consensus
    "distill": {"shared_sketch": True, "backstop": True, "anchor": "A", "lambda_anc": 1.0, "distill": True},
}

RUNG_FLAGS = MappingProxyType({name: MappingProxyType(flags) for name, flags in _FLAGS.items()})
RUNGS: tuple[str, ...] = tuple(RUNG_FLAGS)  # ladder order, naive first
CUSTOM_RUNG = "custom"  # a label for gauge settings that match no rung (sweeps set flags by hand)


def rung_flags(rung: str) -> dict:
    """A copy of ``rung``'s gauge flags; KeyError names the known rungs."""
    try:
        return dict(RUNG_FLAGS[rung])
    except KeyError:
        raise KeyError(f"unknown rung {rung!r}; the rungs are {', '.join(RUNGS)}") from None


__all__ = ["RUNG_FLAGS", "RUNGS", "CUSTOM_RUNG", "rung_flags"]
