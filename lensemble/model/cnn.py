"""Small residual CNN backbone for the encoder (``model.backbone=cnn``): frames -> one feature.

The IMPALA layout (Espeholt et al. 2018) that EB-JEPA's action-conditioned JEPA uses at 64-65 px
(shared/notes/planning-levers.md): per stage, a 3x3 convolution to the stage's width, a 3x3 max
pool of stride 2, then two residual blocks (ReLU-conv-ReLU-conv + skip). Three stages take a
64 px frame to an 8x8 grid. The default widths (8, 16, 32) narrow IMPALA's (16, 32, 32) in the
two full-resolution stages, where the convolutions cost most: a forward-backward of 256 frames
takes 2.5x less CPU than at IMPALA's widths and 1.07x the preset ViT's
(``benchmarks/bench_encoder_backbone.py``). The grid is **flattened, not pooled**: where the agent and the block
sit is the quantity the planner's cost must see, and a global average would discard it (the ViT
pools on its CLS token instead). A ReLU and a linear layer then map the flattened grid to
``embed_dim`` features, which the encoder's projector takes as it takes the ViT's CLS feature.

No normalisation layers: the backbone holds no running statistics, so under federation it is
parameters only (the projector's optional BatchNorm is the encoder's one source of statistics).
"""

from __future__ import annotations

import torch
from torch import nn


class _ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convolutions at a fixed width (shape preserved)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class _Stage(nn.Module):
    """conv 3x3 (c_in -> c) - max pool 3x3 stride 2 (H -> ceil(H/2)) - two residual blocks."""

    def __init__(self, c_in: int, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.res0 = _ResidualBlock(c)
        self.res1 = _ResidualBlock(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res1(self.res0(self.pool(self.conv(x))))


def grid_size(img_size: int, stages: int) -> int:
    """Side of the feature grid after ``stages`` stride-2 pools of an ``img_size`` frame (ceil)."""
    side = int(img_size)
    for _ in range(int(stages)):
        side = (side + 1) // 2  # MaxPool2d(3, stride=2, padding=1): floor((H + 2 - 3) / 2) + 1
    return side


class ImpalaCNN(nn.Module):
    """Normalised frames (B, 3, img, img) -> features (B, out_dim).

    ``channels`` gives each stage's width (``model.cnn_channels``); the flattened
    (channels[-1], g, g) grid, g = :func:`grid_size`, goes through ReLU and Linear(-> out_dim),
    then a final ReLU.
    """

    def __init__(self, img_size: int, channels: tuple[int, ...], out_dim: int):
        super().__init__()
        if not channels:
            raise ValueError("the CNN needs at least one stage (model.cnn_channels)")
        widths = (3, *(int(c) for c in channels))
        self.stages = nn.Sequential(*(_Stage(widths[i], widths[i + 1]) for i in range(len(channels))))
        side = grid_size(img_size, len(channels))
        self.fc = nn.Linear(widths[-1] * side * side, out_dim)
        # channels-last activations: 1.4x less CPU per forward-backward of 256 frames at 64 px than
        # NCHW (benchmarks/bench_encoder_backbone.py, which turns it off for its reference). The
        # weights stay contiguous, so the state dict is ordinary.
        self.channels_last = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        grid = torch.relu(self.stages(x))  # (B, c_last, g, g)
        return torch.relu(self.fc(grid.flatten(1)))
