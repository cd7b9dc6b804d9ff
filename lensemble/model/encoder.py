"""Frame encoder f_θ: image -> one latent z ∈ R^d per frame.

Layout (state-dict prefixes in brackets, relative to the encoder):

1. The backbone, ``model.backbone``, trained from scratch (no pretrained weights), returning one
   (B, embed_dim) feature per frame: ``vit`` (default), a timm ``VisionTransformer`` pooled on its
   CLS token (``num_classes=0``); or ``cnn``, the residual CNN of :mod:`lensemble.model.cnn`
   whose last grid is flattened, so where things sit in the frame survives into the feature.
2. ``projector``: Linear(embed_dim, projector_hidden) - norm - GELU - Linear(-> d), where the norm
   is ``model.projector_norm``: ``layernorm`` (default) or ``batchnorm`` (BatchNorm1d, as LeWM
   puts after the CLS token). BatchNorm running statistics lag the weights on near-identical
   frames (planning fell from 26 % to 6 % until they were re-estimated), so a batchnorm model has
   them recalibrated by :func:`recalibrate_batchnorm` before every checkpoint; they are buffers,
   never federated parameters (docs/model.md says what that means under federation).
3. ``frame``: ``nn.Linear(d, d, bias=False)`` initialised to the identity. It is the last thing
   applied to z, so a change of latent basis z -> z Q is absorbed by ``frame.weight -> Qᵀ W``
   alone (the gauge backstop rotates exactly this tensor). Any BatchNorm sits before it, in the
   projector's hidden layer, so a rotation never touches BatchNorm statistics.

Input normalisation is ``model.input_norm``. ``pixel`` (default): persistent per-pixel buffers
``pixel_mean``/``pixel_std`` (mean and std of the frames a fresh model trains on, see
``fit_input_normalization``), so a checkpoint carries them; uint8 input is divided by 255, then
standardised pixel by pixel. ``global``: the fixed map [0, 1] -> [-1, 1] with no buffers and
nothing fitted, so a change of a background pixel weighs what it weighs in the image.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from lensemble.config.schema import ModelConfig
from lensemble.model.cnn import ImpalaCNN
from lensemble.model.pooled import PoolableBatchNorm1d
from lensemble.model.vit_layers import PatchConv, ViTAttention


class Encoder(nn.Module):
    """Backbone (ViT or CNN) + projector + identity-initialised ``frame`` layer.

    ``forward(x)``: x is uint8 (B, 3, H, W) in [0, 255] or floating (B, 3, H, W) in [0, 1];
    returns z float32 (B, d) with d = ``model_cfg.latent_dim``. Frames whose H, W differ from
    ``img_size`` are resized (bilinear, antialiased) so callers may pass native env renders; for
    exact train/eval parity feed frames already at ``img_size``.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.img_size = cfg.img_size
        self.latent_dim = cfg.latent_dim
        if cfg.backbone == "cnn":
            self.cnn = ImpalaCNN(cfg.img_size, cfg.cnn_channels, cfg.embed_dim)
        else:
            # the attribute names the state-dict prefix ("vit."), which every ViT checkpoint uses
            self.vit = VisionTransformer(
                img_size=cfg.img_size,
                patch_size=cfg.patch_size,
                in_chans=3,
                num_classes=0,
                global_pool="token",
                embed_dim=cfg.embed_dim,
                depth=cfg.depth,
                num_heads=cfg.num_heads,
                class_token=True,
                attn_layer=ViTAttention,  # [precision] timm's attention, bf16 attention products in fp32 on a CPU
            )
            # [precision] the patch embedding's weight gradient in fp32 on a CPU (3x faster than bf16)
            self.vit.patch_embed.proj = PatchConv.like(self.vit.patch_embed.proj)
        self.backbone_kind = cfg.backbone
        # PoolableBatchNorm1d is nn.BatchNorm1d (same tensors) that can also normalise with moments
        # pooled across silos (objective.bn_scope=pooled, lensemble/model/pooled.py)
        norm = (PoolableBatchNorm1d(cfg.projector_hidden) if cfg.projector_norm == "batchnorm"
                else nn.LayerNorm(cfg.projector_hidden))
        self.projector = nn.Sequential(
            nn.Linear(cfg.embed_dim, cfg.projector_hidden),
            norm,
            nn.GELU(),
            nn.Linear(cfg.projector_hidden, cfg.latent_dim),
        )
        self.frame = nn.Linear(cfg.latent_dim, cfg.latent_dim, bias=False)
        with torch.no_grad():
            self.frame.weight.copy_(torch.eye(cfg.latent_dim))
        self.input_norm = cfg.input_norm
        if cfg.input_norm == "pixel":
            # Per-pixel input standardisation (1, 3, img, img). It starts as [0, 1] -> [-1, 1] and
            # is set from public frames by :meth:`fit_input_normalization`: scenes whose frames
            # differ only in a small object are otherwise dominated by the shared background, the
            # untrained ViT maps them to nearly one point, and SIGReg's gradient vanishes at that
            # collapse. Persistent buffers, so the statistics travel with every checkpoint (never
            # trained). The price: a pixel constant in the fitted frames sits at the std floor
            # 0.02, so a tiny change there (another resize kernel) is multiplied by 50, 25x what
            # the global map's factor 2 gives it.
            size = (1, 3, cfg.img_size, cfg.img_size)
            self.register_buffer("pixel_mean", torch.full(size, 0.5))
            self.register_buffer("pixel_std", torch.full(size, 0.5))

    @property
    def fits_input_statistics(self) -> bool:
        """True when the input normalisation has statistics to fit (``input_norm == "pixel"``)."""
        return self.input_norm == "pixel"

    @torch.no_grad()
    def fit_input_normalization(self, frames: torch.Tensor, *, max_frames: int = 4096,
                                min_std: float = 0.02) -> None:
        """Set the per-pixel mean and std from uint8 frames (N, 3, img, img), e.g. the public
        corpus. At most ``max_frames`` evenly spaced frames are used; std is floored at
        ``min_std`` (in [0, 1] pixel units) so constant background pixels are not blown up.
        Only for ``input_norm="pixel"``; a ``global`` encoder has nothing to fit (ValueError)."""
        if not self.fits_input_statistics:
            raise ValueError("input_norm='global' is a fixed map with no statistics to fit")
        if frames.ndim != 4 or tuple(frames.shape[1:]) != tuple(self.pixel_mean.shape[1:]):
            raise ValueError(f"frames must be (N, 3, {self.img_size}, {self.img_size}), got {tuple(frames.shape)}")
        step = max(1, frames.shape[0] // max_frames)
        x = frames[::step].to(torch.float64) / 255.0
        self.pixel_mean.copy_(x.mean(dim=0, keepdim=True).to(self.pixel_mean.dtype))
        self.pixel_std.copy_(x.std(dim=0, keepdim=True).clamp_min(min_std).to(self.pixel_std.dtype))

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 (B,3,H,W) or float in [0,1] -> normalised float32 (B,3,img,img)."""
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(
                f"encoder expects (B, 3, H, W) channels-first frames, got shape {tuple(x.shape)}"
            )
        if x.dtype == torch.uint8:
            x = x.to(torch.float32) / 255.0
        elif not torch.is_floating_point(x):
            raise TypeError(f"encoder expects uint8 or floating frames, got {x.dtype}")
        else:
            x = x.to(torch.float32)
        if x.shape[-2:] != (self.img_size, self.img_size):
            x = F.interpolate(
                x, size=(self.img_size, self.img_size), mode="bilinear", antialias=True,
                align_corners=False,
            )
        if self.input_norm == "global":
            return x * 2.0 - 1.0
        return (x - self.pixel_mean) / self.pixel_std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Frames (B, 3, H, W) -> latents (B, d)."""
        backbone = self.cnn if self.backbone_kind == "cnn" else self.vit
        feat = backbone(self.preprocess(x))  # (B, embed_dim): the ViT's CLS token after its final norm, or the CNN's
        return self.frame(self.projector(feat))

    def batchnorm_layers(self) -> list[nn.modules.batchnorm._BatchNorm]:
        """The encoder's BatchNorm modules (empty for ``projector_norm="layernorm"``)."""
        return [m for m in self.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def encode_frames(self, x: torch.Tensor) -> torch.Tensor:
        """Clips (B, T, 3, H, W) -> latents (B, T, d), all frames in one batched pass."""
        if x.ndim != 5:
            raise ValueError(f"encode_frames expects (B, T, 3, H, W), got shape {tuple(x.shape)}")
        b, t = x.shape[:2]
        return self.forward(x.reshape(b * t, *x.shape[2:])).reshape(b, t, -1)


@torch.no_grad()
def embed_frames(encoder: Encoder, frames: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Latents (n, d) float32 of frames (n, 3, H, W) (uint8 or float in [0, 1]), in eval mode.

    The one batched embedding helper: the coordinator's probe embeddings, the participants'
    replies, checkpoint drift and the evaluation ladder all call it, so every consumer sees the
    frames through the same ``Encoder.forward``. Batches of ``batch_size`` frames bound memory;
    the encoder's train/eval mode is restored afterwards.
    """
    was_training = encoder.training
    encoder.eval()
    try:
        chunks = [encoder(frames[s:s + batch_size]) for s in range(0, frames.shape[0], batch_size)]
    finally:
        encoder.train(was_training)
    return torch.cat(chunks) if chunks else torch.zeros(0, encoder.latent_dim)


@torch.no_grad()
def recalibrate_batchnorm(encoder: Encoder, frame_batches: Iterable[torch.Tensor]) -> int:
    """Re-estimate every BatchNorm running mean/var of ``encoder`` from ``frame_batches``.

    Each batch is (n, 3, H, W) (uint8 or float in [0, 1]) or a clip batch (B, T, 3, H, W),
    encoded in one pass like a training batch. The running statistics are reset and replaced by
    the cumulative (equal-weight) average of the per-batch statistics (``momentum=None``), so the
    result depends only on the weights and the frames, not on the training history. No gradient
    is taken, nothing else in the encoder changes (dropout and the rest stay in eval mode), and
    the train/eval mode and momenta are restored afterwards. ``num_batches_tracked`` ends as the
    number of batches used. Returns that number (0, a no-op, for an encoder without BatchNorm).

    Where the frames come from is the caller's choice, and decides whose statistics the model
    carries: training batches (``train_local``), public frames (a coordinator), a silo's frames
    (a participant; such statistics are data summaries and must not leave the silo).
    """
    layers = encoder.batchnorm_layers()
    if not layers:
        return 0
    was_training = encoder.training
    momenta = [m.momentum for m in layers]
    encoder.eval()
    n = 0
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None
            m.train()
        for batch in frame_batches:
            if batch.ndim == 5:
                batch = batch.reshape(-1, *batch.shape[2:])
            if batch.shape[0] < 2:
                raise ValueError("BatchNorm recalibration needs batches of at least 2 frames")
            encoder(batch)
            n += 1
    finally:
        for m, mom in zip(layers, momenta, strict=True):
            m.momentum = mom
        encoder.train(was_training)
    if n == 0:
        raise ValueError("recalibrate_batchnorm got no batches: the running statistics would be reset to 0/1")
    return n
