"""The federated state: which tensors a round averages, and state dicts as wire arrays.

Only trainable parameters are federated. Fixed tensors (the encoder's input-standardisation
buffers; the whole encoder under Fork A) ride along unchanged from the global model and never
enter a pseudo-gradient, so DP noise or the outer momentum can never move them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from lensemble.config.schema import LensembleConfig, ModelConfig
from lensemble.model.world_model import build_world_model


def to_arrays(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A state dict as name-sorted numpy arrays (what an ArrayRecord carries)."""
    return {k: v.detach().cpu().numpy() for k, v in sorted(state.items())}


def to_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Name-sorted tensors that own a copy of ``arrays`` (a received record may be read-only)."""
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in sorted(arrays.items())}


def federated_keys(cfg: LensembleConfig) -> frozenset[str]:
    """Names of the tensors that are federated: the model's trainable parameters."""
    return _federated_keys(cfg.model)


@lru_cache(maxsize=8)
def _federated_keys(model_cfg: ModelConfig) -> frozenset[str]:
    model = build_world_model(model_cfg, init_seed=0)  # seeded: leaves the global RNG untouched
    if model_cfg.encoder_frozen:
        for p in model.encoder.parameters():
            p.requires_grad_(False)
    return frozenset(n for n, p in model.named_parameters() if p.requires_grad)


def split_state(state: dict[str, torch.Tensor], keys: frozenset[str]) -> tuple[dict, dict]:
    """(federated part, fixed part) of a full state dict."""
    return ({k: v for k, v in state.items() if k in keys}, {k: v for k, v in state.items() if k not in keys})


__all__ = ["to_arrays", "to_tensors", "federated_keys", "split_state"]
