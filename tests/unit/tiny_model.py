"""A test-sized ModelConfig shared by the model unit tests (16 px, d = 16)."""

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
