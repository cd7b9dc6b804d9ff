"""A test-sized ModelConfig shared by the model unit tests (16 px, d = 16), and their seeded inputs."""

import torch

from lensemble.config.schema import ModelConfig

D = 16


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(
        img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, latent_dim=D,
        projector_hidden=32, predictor_width=32, predictor_depth=1, predictor_heads=2,
        history=3, action_dim=2, action_block=2, action_embed_dim=8,
    )
    base.update(kw)
    return ModelConfig(**base)


def frames(n, size=16, seed=0):
    """n random uint8 frames (n, 3, size, size), seeded."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)


def random_orthogonal(d, seed=0):
    """A seeded random d x d rotation (QR with the sign fixed), float32."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()
