"""Update-level differential-privacy ledger (RDP accountant from opacus).

One release = one clipped, noised pseudo-gradient from one participant in one round, i.e. one
Gaussian-mechanism step with noise multiplier σ and sampling rate q (1.0: every round counts).
The ledger lives for the whole run and is saved with the coordinator's state, so a resumed run
keeps spending the same budget instead of starting from zero.

Protocol per round: :meth:`PrivacyLedger.check_release` (or :meth:`epsilon_after`) *before*
anything leaves — it raises :class:`PrivacyBudgetExceeded` if the release would push ε past
``target_epsilon`` — then :meth:`PrivacyLedger.step` once the release has happened.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from copy import deepcopy
from pathlib import Path

from opacus.accountants import RDPAccountant

from lensemble.errors import ConfigError, PrivacyBudgetExceeded
from lensemble.federation.messages import participant_id

_STATE_VERSION = 1


class PrivacyLedger:
    """Running (ε, δ) of a participant's releases under the Gaussian mechanism.

    ``noise_multiplier`` σ (noise std = σ·clip_norm), ``sample_rate`` q in (0, 1], ``delta`` δ,
    ``target_epsilon``: the budget; ``None`` means track but never refuse. With σ = 0 there is
    no privacy and ε is reported as ``inf``.
    """

    def __init__(
        self,
        noise_multiplier: float,
        sample_rate: float = 1.0,
        delta: float = 1e-5,
        target_epsilon: float | None = None,
    ):
        if noise_multiplier < 0:
            raise ConfigError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if not 0 < sample_rate <= 1:
            raise ConfigError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if not 0 < delta < 1:
            raise ConfigError(f"delta must be in (0, 1), got {delta}")
        if target_epsilon is not None and not target_epsilon > 0:
            raise ConfigError(f"target_epsilon must be > 0, got {target_epsilon}")
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        self.delta = float(delta)
        self.target_epsilon = None if target_epsilon is None else float(target_epsilon)
        self._accountant = RDPAccountant()

    @classmethod
    def from_config(cls, privacy_cfg, sample_rate: float = 1.0) -> PrivacyLedger:
        """Build from a :class:`lensemble.config.schema.PrivacyConfig`."""
        return cls(
            noise_multiplier=privacy_cfg.noise_multiplier,
            sample_rate=sample_rate,
            delta=privacy_cfg.delta,
            target_epsilon=privacy_cfg.target_epsilon,
        )

    @property
    def releases(self) -> int:
        """Number of releases recorded so far."""
        return sum(int(n) for _, _, n in self._accountant.history)

    def _epsilon_of(self, history: list) -> float:
        if not history:
            return 0.0
        if any(sigma == 0 for sigma, _, _ in history):
            return math.inf  # noise-free release: no finite guarantee (skip opacus' warning path)
        acc = RDPAccountant()
        acc.history = history
        return float(acc.get_epsilon(delta=self.delta))

    def epsilon(self) -> float:
        """ε spent so far at this ledger's δ (0 before the first release)."""
        return self._epsilon_of(self._accountant.history)

    def epsilon_for(self, releases: int) -> float:
        """ε after ``releases`` releases in all at this ledger's σ, q and δ (its history ignored)."""
        if releases < 0:
            raise ValueError(f"releases must be >= 0, got {releases}")
        return self._epsilon_of([(self.noise_multiplier, self.sample_rate, int(releases))] if releases else [])

    def epsilon_after(self, rounds: int = 1) -> float:
        """ε the ledger would report after ``rounds`` *further* releases. Does not change state."""
        if rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {rounds}")
        history = deepcopy(self._accountant.history)
        if rounds:
            history.append((self.noise_multiplier, self.sample_rate, int(rounds)))
        return self._epsilon_of(history)

    def check_release(self, rounds: int = 1) -> float:
        """Call before releasing: return the ε the release would bring, or raise if over budget.

        Raises :class:`PrivacyBudgetExceeded` (fail-closed: do not send the update) when
        ``target_epsilon`` is set and would be exceeded.
        """
        eps = self.epsilon_after(rounds)
        if self.target_epsilon is not None and not eps <= self.target_epsilon:
            raise PrivacyBudgetExceeded(
                f"releasing {rounds} more update(s) would bring ε to {eps:.4g} "
                f"> target {self.target_epsilon:.4g} (δ={self.delta:g}, {self.releases} released so far)",
                epsilon=eps,
                target_epsilon=self.target_epsilon,
                releases=self.releases,
            )
        return eps

    def step(self) -> float:
        """Record one release that has happened; return the new ε.

        Never refuses: the release is already out, and under-counting would be worse than
        over-spending. Call :meth:`check_release` first.
        """
        self._accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)
        return self.epsilon()

    def state_dict(self) -> dict:
        """Plain-Python state (JSON-serialisable): parameters and the accountant history."""
        return {
            "version": _STATE_VERSION,
            "mechanism": self._accountant.mechanism(),
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
            "target_epsilon": self.target_epsilon,
            "history": [[float(s), float(q), int(n)] for s, q, n in self._accountant.history],
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a saved ledger. σ, q and δ must match this ledger's, else :class:`ConfigError`.

        ``target_epsilon`` may differ (a user may raise the budget on resume); the history is
        what matters for ε.
        """
        if state.get("mechanism") != self._accountant.mechanism():
            raise ConfigError(f"privacy ledger state is for mechanism {state.get('mechanism')!r}")
        for key in ("noise_multiplier", "sample_rate", "delta"):
            if float(state[key]) != getattr(self, key):
                raise ConfigError(
                    f"privacy ledger was saved with {key}={state[key]}, this run uses {getattr(self, key)}",
                    remediation="Resume with the privacy settings the run was started with.",
                )
        # tuples, because RDPAccountant.step merges a new step into the last entry by comparing it
        self._accountant.history = [(float(s), float(q), int(n)) for s, q, n in state["history"]]


def write_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a crash leaves the old or the new file, never a
    torn one, and the new one is on disk (fsync) before this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves the old ledger, not a torn temporary
        raise
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


class ReleaseTally:
    """The coordinator's durable upper bound on how often each silo has released.

    A participant counts its own releases exactly (its ledger, recorded before the reply leaves)
    and reports the count with every reply (``dp/releases``). The coordinator cannot see a release
    whose reply was lost (a crash, a late reply, a killed coordinator), so it also counts its own
    asks, on disk *before* each ask goes out: silo c has released at most
    ``reported_c + (asks − asks_at_report_c)`` times, and a silo that never replied at most
    ``asks`` times. The run's ``dp/epsilon`` is ε at the largest such bound over all silos; when
    every silo answered the latest ask it equals the largest real count. The file
    (``<run_dir>/privacy.json``) only ever grows: a resumed run continues it, never rolls it back.
    """

    def __init__(self, path: str | os.PathLike, num_silos: int):
        self.path = Path(path)
        self.num_silos = int(num_silos)
        self.asks = 0
        self.silos: dict[str, list[int]] = {}  # participant id -> [releases reported, asks then]
        if self.path.exists():
            state = json.loads(self.path.read_text())
            self.asks = int(state["asks"])
            self.silos = {str(k): [int(v[0]), int(v[1])] for k, v in state["silos"].items()}

    def _save(self) -> None:
        write_durably(self.path, json.dumps({"version": _STATE_VERSION, "asks": self.asks,
                                             "silos": self.silos}, sort_keys=True) + "\n")

    def before_ask(self) -> None:
        """Count one ask of every silo; on disk before anything is sent."""
        self.asks += 1
        self._save()

    def record(self, participant_id: str, releases: int) -> None:
        """A reply from ``participant_id`` said it has released ``releases`` times in all."""
        old = self.silos.get(participant_id, [0, 0])[0]
        self.silos[participant_id] = [max(int(releases), old), self.asks]
        self._save()

    def bound(self) -> int:
        """The largest number of releases any silo may have made (see the class docstring)."""
        worst = 0
        for c in range(self.num_silos):
            got = self.silos.get(participant_id(c))
            worst = max(worst, self.asks if got is None else got[0] + self.asks - got[1])
        return worst

    def state_dict(self) -> dict:
        return {"asks": self.asks, "silos": {k: list(v) for k, v in sorted(self.silos.items())},
                "bound": self.bound()}


__all__ = ["PrivacyLedger", "ReleaseTally", "write_durably"]
