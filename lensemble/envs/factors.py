"""Factors of variation: a finite catalog of values per environment, with fixed roles.

stable-worldmodel exposes each environment's factors as a nested ``variation_space`` addressed by
dotted keys (``"agent.color"``, ``"door.position"``, ...). Most of those spaces are continuous
(an RGB colour has 256³ values), so silos, held-out splits and the public probe cannot be defined
on them directly. This module fixes, per environment, a short list of candidate values for the
factors we partition on, and gives every value one of three roles:

- ``silo``     values that the partitioner may hand to silos (and that in-distribution evaluation uses);
- ``transfer`` values that no silo ever sees: the held-out-factor ("factor") split;
- ``public``   values reserved for the public probe, disjoint from the two above.

The roles depend only on the value's index, never on a seed, so the transfer set and the public
probe values stay the same across seeds, silo counts and severities: runs of one sweep are scored
on the same held-out values. Public and transfer indices are interleaved with the silo indices
around the colour wheel (or along the numeric range) so that transfer is interpolation between
seen values rather than extrapolation to one end of the range.

Values are stored JSON-ready (ints, floats and lists of them) so that they can be written into
shard labels and reports verbatim; :func:`to_env_value` converts one to what the env expects.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from typing import Any

import numpy as np

from lensemble.errors import ConfigError

TWOROOM = "swm/TwoRoom-v1"
PUSHT = "swm/PushT-v1"
REACHER = "swm/ReacherDMControl-v0"

#: The factor that defines silos when the config does not say otherwise. Agent colour changes
#: only the appearance of the one object whose position the world model must track, so the silos
#: see the same dynamics through different pixels: a pure representation (gauge) shift, which is
#: what the frame-drift and anchoring study needs. Dynamics factors (speed, door position) are in
#: the catalog for studies that want a dynamics shift instead.
DEFAULT_PARTITION_FACTOR = "agent.color"


@dataclass(frozen=True)
class FactorSpec:
    """One partitionable factor: its dotted key, candidate values and their roles.

    ``values[i]`` is JSON-ready; ``public`` and ``transfer`` are index tuples into ``values``;
    every other index is a silo value.
    """

    key: str
    values: tuple
    public: tuple[int, ...]
    transfer: tuple[int, ...]
    description: str = ""

    @property
    def silo(self) -> tuple[int, ...]:
        """Indices of the values silos may own, in catalog order."""
        reserved = set(self.public) | set(self.transfer)
        return tuple(i for i in range(len(self.values)) if i not in reserved)

    def value(self, index: int) -> Any:
        """The JSON-ready value at ``index``."""
        return self.values[index]

    def values_at(self, indices) -> list:
        return [self.values[i] for i in indices]


def _roles(n: int, period: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    # Within every block of `period` consecutive values, index 1 is public and the last index is
    # transfer: both roles are spread evenly over the range, and each sits between silo values.
    public = tuple(i for i in range(n) if i % period == 1)
    transfer = tuple(i for i in range(n) if i % period == period - 1)
    return public, transfer


def _hues(n: int, saturation: float, value: float) -> tuple[list[int], ...]:
    """``n`` RGB colours (uint8 triples as lists) evenly spaced around the hue circle."""
    out = []
    for i in range(n):
        r, g, b = colorsys.hsv_to_rgb(i / n, saturation, value)
        out.append([int(round(255 * r)), int(round(255 * g)), int(round(255 * b))])
    return tuple(out)


def _spec(key: str, values, period: int, description: str) -> FactorSpec:
    values = tuple(values)
    public, transfer = _roles(len(values), period)
    return FactorSpec(key, values, public, transfer, description)


#: The coverage factor (TwoRoom): the x range [lo, hi] (env px of the 224 px frame) in which the
#: agent starts, the target lies and the collection expert draws its waypoints; y stays free. The
#: wall is the vertical stripe at x = 112, so [0, 112] is the left room and [112, 224] the right
#: one: silos that own one room each see the other only through the (1 − severity) share of their
#: episodes. Public: a 40 px band around the wall, whose episodes cross the door (conditions no
#: silo owns). Transfer: the whole arena with the env's own start and target sampling (cross-room
#: tasks). Placement is the adapter's (EnvAdapter.reset), seeded by the reset seed.
REGION_FACTOR = "agent.region"
REGION_LEFT, REGION_DOOR, REGION_RIGHT, REGION_ALL = [0, 112], [92, 132], [112, 224], [0, 224]
#: Factors the env has no variation for: the adapter applies them at reset and never passes them
#: to the env's variation space.
ADAPTER_FACTORS = frozenset({REGION_FACTOR})


def _tworoom_catalog() -> dict[str, FactorSpec]:
    specs = [
        # Saturated hues at 90 % value: visible against the white floor and the black walls.
        _spec("agent.color", _hues(24, 1.0, 0.9), 6, "colour of the agent dot (appearance only)"),
        # Pale tints, so that every agent colour stays visible on top of them.
        _spec("background.color", _hues(12, 0.18, 1.0), 6, "floor colour (appearance only)"),
        _spec("wall.color", _hues(12, 0.8, 0.35), 6, "wall colour (appearance only)"),
        # Door centre along the wall, in env pixels (224 px frame). The door half-width is 14 px,
        # so these keep the whole opening inside the borders.
        _spec("door.position", [[int(p)] * 3 for p in np.linspace(40, 184, 12).round()], 6,
              "door centre along the wall (changes the shortest paths)"),
        # Env pixels per step at |action| = 1: a pure dynamics shift.
        _spec("agent.speed", [[round(float(s), 2)] for s in np.linspace(3.0, 8.5, 12)], 6,
              "agent speed in px per step (dynamics)"),
        # Up to 12 px so that the default door (half-width 14) still fits the agent with margin.
        _spec("agent.radius", [[round(float(r), 2)] for r in np.linspace(7.0, 12.0, 12)], 6,
              "agent radius in px (appearance and collisions)"),
        # Roles are explicit, not _roles(): two silo values (the rooms), one public, one transfer.
        FactorSpec(REGION_FACTOR, (REGION_LEFT, REGION_DOOR, REGION_RIGHT, REGION_ALL), public=(1,),
                   transfer=(3,), description="x range the episode's start, target and expert waypoints "
                   "lie in (state-space coverage; one room per silo at severity 1)"),
    ]
    return {s.key: s for s in specs}


def _pusht_catalog() -> dict[str, FactorSpec]:
    specs = [
        _spec("agent.color", _hues(24, 0.85, 0.9), 6, "colour of the pusher (appearance only)"),
        _spec("block.color", _hues(24, 0.6, 0.7), 6, "colour of the pushed block (appearance only)"),
        _spec("background.color", _hues(12, 0.15, 1.0), 6, "floor colour (appearance only)"),
        # Shapes 1..7 = L, T, Z, square, I, small tee, plus (the env's own list order).
        _spec("block.shape", list(range(1, 8)), 7, "shape of the pushed block (appearance and contact)"),
    ]
    return {s.key: s for s in specs}


def _unit_rgb(colours) -> list[list[float]]:
    """uint8 RGB triples -> [0, 1] floats (MuJoCo's material colours), rounded for readable labels."""
    return [[round(c / 255, 3) for c in rgb] for rgb in colours]


def _reacher_catalog() -> dict[str, FactorSpec]:
    # The DMControl spaces are float colours in [0, 1], not uint8 (stable-worldmodel 0.1.1,
    # ReacherDMControlWrapper.variation_space). The target is not drawn (rendering.render_target
    # = 0 by default): goals are arm poses shown by a goal image, so only the arm and the floor
    # are on screen.
    floor = [[[round(0.35 * c, 3) for c in rgb], [round(0.5 * c, 3) for c in rgb]]
             for rgb in _unit_rgb(_hues(12, 0.6, 0.9))]  # two shades per hue: the checker's squares
    specs = [
        # Bright, saturated arm colours: visible against every (dark) floor below.
        _spec("agent.color", _unit_rgb(_hues(24, 0.8, 1.0)), 6, "colour of the arm (appearance only)"),
        _spec("floor.color", floor, 6, "colours of the floor's checker squares (appearance only)"),
        # The upper link's density (kg/m³) scales its mass and inertia under the same torques, but
        # weakly: 500 or 1500 against the default 1000 moves 25 random-action steps by < 0.02 rad
        # (tests/unit/test_reacher.py), under the 0.05 rad success tolerance.
        _spec("agent.arm_density", [[round(float(d))] for d in np.linspace(500, 1500, 12)], 6,
              "density of the upper arm in kg/m³ (a weak dynamics shift)"),
        _spec("light.intensity", [[round(float(v), 3)] for v in np.linspace(0.35, 1.0, 12)], 6,
              "diffuse light intensity (appearance only)"),
    ]
    return {s.key: s for s in specs}


_CATALOGS = {TWOROOM: _tworoom_catalog(), PUSHT: _pusht_catalog(), REACHER: _reacher_catalog()}


def supported_envs() -> list[str]:
    """Environment ids with a factor catalog (the ones the adapter supports)."""
    return sorted(_CATALOGS)


def factor_catalog(env_id: str) -> dict[str, FactorSpec]:
    """All partitionable factors of ``env_id``, keyed by dotted name.

    Raises ConfigError for an environment without a catalog.
    """
    if env_id not in _CATALOGS:
        raise ConfigError(
            f"unknown environment {env_id!r}",
            remediation=f"set env.id to one of {supported_envs()}",
        )
    return _CATALOGS[env_id]


def factor_spec(env_id: str, key: str) -> FactorSpec:
    """The catalog entry of factor ``key`` in ``env_id``; ConfigError if it has none."""
    catalog = factor_catalog(env_id)
    if key not in catalog:
        raise ConfigError(
            f"{key!r} is not a partitionable factor of {env_id}",
            remediation=f"set data.partition_factor to one of {sorted(catalog)}",
        )
    return catalog[key]


def to_env_value(space, value: Any):
    """Convert a JSON-ready factor value to what the stable-worldmodel sub-space accepts.

    The spaces check dtypes strictly (a float64 array is not "in" a float32 Box), so the value is
    cast to the space's own dtype and shape.
    """
    kind = type(space).__name__
    if kind == "Discrete":
        return int(np.asarray(value).reshape(()))
    arr = np.asarray(value, dtype=space.dtype)
    if tuple(space.shape) != arr.shape:
        arr = arr.reshape(space.shape)
    return arr


def to_json_value(value: Any) -> Any:
    """Make an env-side factor value (numpy scalar/array, tensor) JSON-ready."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
