"""Silo partitioner: which factor value each silo's episodes get, at a given non-IID severity.

Silos differ by one factor of variation (``data.partition_factor``, default ``agent.color``).
The factor's catalog values (see :mod:`lensemble.envs.factors`) are split by role:
``silo`` values are dealt to silos, ``transfer`` values are kept from every silo (the held-out
factor split), ``public`` values are kept for the public probe.

Severity ``s`` in [0, 1]: each silo ``c`` owns a *home* set H_c of silo values (the silo values
dealt round-robin after a seeded shuffle, so the H_c are disjoint and differ in size by at most
one). With more silos than silo values, ``shared_homes`` gives silo ``c`` the single value at
position ``c mod |pool|`` of that shuffle instead (silos ``c`` and ``c + |pool|`` share a home:
four silos over agent.region's two rooms are two per room). Silo ``c``'s episodes follow the mixture

    p_c = s · Uniform(H_c) + (1 − s) · Uniform(all silo values)

realised by quota rather than by coin flips: round(s·n) episodes cycle through H_c and the rest
cycle through all silo values, each in a seeded random order. Quotas make the extremes exact at
any episode count: s = 1 gives disjoint silos, s = 0 gives every silo every silo value as soon as
it has at least as many episodes as there are silo values. Train and held-out episodes are dealt
separately so both follow p_c.

Held-out splits are named by the held-out unit:

- ``episode``: episodes of each silo, drawn from p_c, that training never sees;
- ``factor``:  episodes with transfer values (no silo has them);
- ``silo``:    a whole silo left out of training (:attr:`SiloPlan.held_out_silo`), for
  leave-one-silo-out evaluation; the data layer only names it.

Everything is a pure function of the root seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from lensemble.config.seeds import derive, numpy_rng
from lensemble.envs.factors import factor_spec
from lensemble.errors import ConfigError


@dataclass(frozen=True)
class SiloPlan:
    """Per-silo factor assignments. All value references are indices into ``values``."""

    env_id: str
    factor: str
    severity: float
    num_silos: int
    values: tuple            # the factor's catalog values, JSON-ready
    silo_pool: tuple         # indices silos may receive
    transfer: tuple          # indices no silo receives (factor split)
    public: tuple            # indices reserved for the public probe
    home: tuple              # home[c]: indices silo c owns
    train: tuple             # train[c][i]: value index of silo c's i-th training episode
    heldout: tuple           # heldout[c][i]: value index of silo c's i-th held-out episode
    held_out_silo: int       # the silo named by the "silo" split

    def factors(self, index: int) -> dict:
        """The factor dict (dotted key -> JSON value) for catalog index ``index``."""
        return {self.factor: self.values[index]}

    def seen_by(self, silo: int) -> set[int]:
        """Indices silo ``silo`` has in its training or held-out episodes."""
        return set(self.train[silo]) | set(self.heldout[silo])

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = [list(x) if isinstance(x, tuple) else x for x in v]
        return d


def _deal(rng, pool: list[int], n: int) -> list[int]:
    # Cycle through the pool in a fresh random order per pass: every value appears
    # floor(n/|pool|) or ceil(n/|pool|) times.
    out: list[int] = []
    while len(out) < n:
        out.extend(int(i) for i in rng.permutation(pool))
    return out[:n]


def _silo_episodes(rng, home: list[int], pool: list[int], n: int, severity: float) -> list[int]:
    n_home = int(math.floor(severity * n + 0.5))
    if n_home and not home:
        raise AssertionError("home set empty at positive severity")  # guarded by the caller
    episodes = _deal(rng, home, n_home) + _deal(rng, pool, n - n_home)
    rng.shuffle(episodes)
    return episodes


def partition_silos(
    env_id: str,
    factor: str,
    num_silos: int,
    episodes_per_silo: int,
    severity: float,
    seed: int,
    heldout_episodes: int = 0,
    shared_homes: bool = False,
) -> SiloPlan:
    """Deal factor values to ``num_silos`` silos (see the module docstring).

    ``seed`` is the run's root seed; every random choice uses ``derive(seed, "partition", ...)``.
    Raises ConfigError when the factor is not partitionable in ``env_id``, the severity is outside
    [0, 1], or a positive severity asks for more silos than there are silo values without
    ``shared_homes``.
    """
    if not 0.0 <= float(severity) <= 1.0:
        raise ConfigError(f"severity {severity} is outside [0, 1]", remediation="set data.severity in [0, 1]")
    if num_silos < 1 or episodes_per_silo < 1 or heldout_episodes < 0:
        raise ConfigError("need num_silos >= 1, episodes_per_silo >= 1, heldout_episodes >= 0",
                          remediation="fix data.num_silos / data.episodes_per_silo / data.heldout_episodes")
    spec = factor_spec(env_id, factor)
    pool = list(spec.silo)
    shared = num_silos > len(pool)
    if severity > 0 and shared and not shared_homes:
        raise ConfigError(
            f"{num_silos} silos cannot each own values of {factor!r}: it has {len(pool)} silo values",
            remediation=f"use at most {len(pool)} silos, severity 0, data.shared_homes=true (silos share home "
                        "values), or another data.partition_factor",
        )
    order = [int(i) for i in numpy_rng(seed, "partition", factor, "home").permutation(pool)]
    # Without sharing the homes are disjoint; with it (more silos than values) each silo owns one value.
    home = ([[order[c % len(pool)]] for c in range(num_silos)] if shared and shared_homes
            else [sorted(order[c::num_silos]) for c in range(num_silos)])
    train, heldout = [], []
    for c in range(num_silos):
        rng = numpy_rng(seed, "partition", factor, "silo", c)
        train.append(tuple(_silo_episodes(rng, home[c], pool, episodes_per_silo, severity)))
        heldout.append(tuple(_silo_episodes(rng, home[c], pool, heldout_episodes, severity)))
    return SiloPlan(
        env_id=env_id,
        factor=factor,
        severity=float(severity),
        num_silos=int(num_silos),
        values=spec.values,
        silo_pool=tuple(pool),
        transfer=tuple(spec.transfer),
        public=tuple(spec.public),
        home=tuple(tuple(h) for h in home),
        train=tuple(train),
        heldout=tuple(heldout),
        held_out_silo=derive(seed, "split", "silo") % num_silos,
    )


def plan_from_config(cfg) -> SiloPlan:
    """:func:`partition_silos` with the values of a ``LensembleConfig``."""
    d = cfg.data
    return partition_silos(cfg.env.id, d.partition_factor, d.num_silos, d.episodes_per_silo,
                           d.severity, cfg.root_seed, d.heldout_episodes, d.shared_homes)


def check_partition_config(cfg) -> None:
    """The cross-field checks of ``data`` that the schema cannot make alone (ConfigError):
    the partition factor exists in ``env.id``'s catalog, severity > 0 has at least one silo value
    per silo. The same function :func:`plan_from_config` runs before a collection (``run``), so
    ``lensemble config`` refuses exactly what ``run`` would."""
    plan_from_config(cfg)
