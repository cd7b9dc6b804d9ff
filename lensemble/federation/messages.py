"""What travels in a DiLoCo round, framework-free: the participant's reply and its node's identity.

The Flower adapters (``federation/flower/``) turn these into records and back; the in-process
engine passes them as they are. Both sides key participants by :func:`participant_id`, so every
engine labels silos alike (``silo-0``, ``silo-1``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lensemble.federation.validation import check_egress


def participant_id(partition_id: int) -> str:
    """The coordinator's key for the participant holding silo ``partition_id`` (0-based)."""
    return f"silo-{int(partition_id)}"


@dataclass
class Reply:
    """One participant's answer for one round: the only thing that leaves a silo.

    payload: the codec form of the (aligned, clipped, noised, quantised) pseudo-gradient;
    probe_embeddings: float32 (|P|, d) embeddings of the PUBLIC probe by the local encoder;
    metrics: scalars (losses, update norm and bytes, compute seconds).
    """

    round_index: int
    payload: dict[str, np.ndarray]
    probe_embeddings: np.ndarray
    metrics: dict[str, float | int | str | bool] = field(default_factory=dict)

    def egress(self) -> dict:
        """The reply as the egress guard sees it; raises ResidencyViolation on anything extra."""
        out = {"delta": self.payload, "probe_embeddings": self.probe_embeddings, "metrics": self.metrics}
        check_egress(out)
        return out


@dataclass(frozen=True)
class NodeSpec:
    """Where a participant's silo and local state live.

    partition_id: which silo (0-based). data_path: a collection folder (``collection.json``) that
    holds this silo's shards and the public probe; None in simulation (the config's collection).
    state_dir: local folder for the inner optimizer state and the DP ledger across rounds.
    """

    partition_id: int
    data_path: str | None
    state_dir: str

    @property
    def participant_id(self) -> str:
        return participant_id(self.partition_id)


__all__ = ["Reply", "NodeSpec", "participant_id"]
