"""The world model (encoder + predictor), its architecture record and checkpoint rebuild.

State-dict keys are the contract other subpackages rely on (docs/CONTRACTS.md):
``encoder.frame.weight``, ``predictor.in_proj.{weight,bias}``, ``predictor.out_proj.{weight,bias}``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from lensemble.config.schema import ModelConfig
from lensemble.config.seeds import derive
from lensemble.errors import ArtifactError
from lensemble.model.encoder import Encoder
from lensemble.model.predictor import Predictor

ARCH_FORMAT = "lensemble.world_model.v1"

# The four tensors a latent-basis change z -> z Q touches (row convention), in contract order.
GAUGE_KEYS = (
    "encoder.frame.weight",
    "predictor.in_proj.weight",
    "predictor.out_proj.weight",
    "predictor.out_proj.bias",
)


class WorldModel(nn.Module):
    """``encoder``: frames (B,3,H,W) -> z (B,d); ``predictor``: (z (B,T,d), a (B,T,A*b)) -> next z."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.predictor = Predictor(cfg)
        if cfg.encoder_frozen:
            self.encoder.requires_grad_(False)

    @property
    def latent_dim(self) -> int:
        return self.cfg.latent_dim

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Frames (B, 3, H, W) -> (B, d), or clips (B, T, 3, H, W) -> (B, T, d)."""
        return self.encoder.encode_frames(obs) if obs.ndim == 5 else self.encoder(obs)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip obs (B, K, 3, H, W), actions (B, K-1, A*b) -> (z (B,K,d), predictions (B,K-1,d))."""
        z = self.encoder.encode_frames(obs)
        return z, self.predictor(z[:, :-1], actions)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters with requires_grad (excludes the encoder under Fork A)."""
        return [p for p in self.parameters() if p.requires_grad]


def build_world_model(model_cfg: ModelConfig, *, init_seed: int | None = None) -> WorldModel:
    """Build a freshly initialised world model.

    With ``init_seed`` the initialisation draws from ``derive(init_seed, "model_init")`` inside a
    forked RNG, so it is reproducible and leaves the global torch RNG untouched; without it the
    current global RNG is used. Fork A (``model_cfg.encoder_frozen``) freezes the encoder.
    """
    if init_seed is None:
        return WorldModel(model_cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive(init_seed, "model_init"))
        return WorldModel(model_cfg)


def architecture(model_cfg: ModelConfig) -> dict:
    """JSON-able description sufficient to rebuild the module (for checkpoint headers)."""
    return {"format": ARCH_FORMAT, "class": "WorldModel", "model": model_cfg.model_dump(mode="json")}


def world_model_from_state(arch: Mapping, tensors: Mapping[str, object]) -> WorldModel:
    """Rebuild a :class:`WorldModel` from :func:`architecture`'s dict and a checkpoint's tensors.

    The load is strict: a missing, extra or mis-shaped tensor raises :class:`ArtifactError`.
    Tensors may be torch tensors or numpy arrays; they are copied into fp32 parameters on CPU.
    """
    if arch.get("format") != ARCH_FORMAT or "model" not in arch:
        raise ArtifactError(
            f"unknown world-model architecture record (format={arch.get('format')!r})",
            remediation=f"rebuild the checkpoint with an architecture of format {ARCH_FORMAT}",
        )
    try:
        cfg = ModelConfig.model_validate(dict(arch["model"]))
    except Exception as exc:  # pydantic ValidationError: surface as an artifact problem
        raise ArtifactError(f"invalid model config in checkpoint architecture: {exc}") from None
    model = WorldModel(cfg)
    state = {
        k: (torch.from_numpy(np.asarray(v)) if not isinstance(v, torch.Tensor) else v)
        for k, v in tensors.items()
    }
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ArtifactError(
            f"checkpoint tensors do not match the architecture: {exc}",
            remediation="load the checkpoint with the architecture record saved alongside it",
        ) from None
    return model


@torch.no_grad()
def rotate_latent_basis_(model: WorldModel, q: torch.Tensor) -> WorldModel:
    """In place: re-express the model in the latent basis z' = z Q (Q orthogonal, d x d).

    Applies the contract's exact reparametrisation: frame.weight -> Qᵀ W, in_proj.weight -> W Q,
    out_proj.weight -> Qᵀ W, out_proj.bias -> Qᵀ b. Afterwards encoder(x) == old_encoder(x) Q and
    predictor(z Q, a) == old_predictor(z, a) Q up to floating-point error.
    """
    d = model.latent_dim
    if q.shape != (d, d):
        raise ValueError(f"Q must be ({d}, {d}), got {tuple(q.shape)}")
    enc_frame = model.encoder.frame.weight
    qd = q.to(device=enc_frame.device, dtype=torch.float64)
    for param, new in (
        (enc_frame, qd.T @ enc_frame.double()),
        (model.predictor.in_proj.weight, model.predictor.in_proj.weight.double() @ qd),
        (model.predictor.out_proj.weight, qd.T @ model.predictor.out_proj.weight.double()),
        (model.predictor.out_proj.bias, qd.T @ model.predictor.out_proj.bias.double()),
    ):
        param.copy_(new.to(param.dtype))
    return model


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of scalar parameters (optionally only those with requires_grad)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
