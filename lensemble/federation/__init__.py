"""Framework-free federation: DiLoCo rounds between a coordinator and participants.

Nothing in this package outside ``flower/`` imports Flower; the Flower apps are thin adapters
over these modules, so the same round logic runs in-process in milliseconds and unchanged on real
nodes.

- :mod:`~lensemble.federation.participant` — one silo's round (inner steps, alignment, release);
- :mod:`~lensemble.federation.coordinator` — validation, quorum, outer step, drift, commit;
- :mod:`~lensemble.federation.rounds` — the one round driver every engine uses;
- :mod:`~lensemble.federation.inprocess` — the engine without Flower;
- :mod:`~lensemble.federation.simulation` — every engine on one machine (Ray, in-process grid);
- :mod:`~lensemble.federation.replay` — rounds of a finished run replayed, verified, their drift re-measured;
- :mod:`~lensemble.federation.messages`, :mod:`~lensemble.federation.state` — what travels;
- :mod:`~lensemble.federation.pseudograd`, :mod:`~lensemble.federation.release`,
  :mod:`~lensemble.federation.codec` — pseudo-gradients, clip/noise/int8, wire encoding;
- :mod:`~lensemble.federation.outer`, :mod:`~lensemble.federation.validation`,
  :mod:`~lensemble.federation.privacy` — the Nesterov outer step, reply checks, the DP ledger;
- :mod:`~lensemble.federation.locks`, :mod:`~lensemble.federation.checks`,
  :mod:`~lensemble.federation.faults` — folder locks, cross-field config checks, fault injection.

The package namespace exports nothing: importing it must stay cheap (no torch model, no Flower,
no opacus) for Ray workers and the CLI.
"""
