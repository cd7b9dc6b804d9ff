"""JEPA world model: ViT encoder, causal action-conditioned predictor, SIGReg objective."""

from lensemble.model.encoder import Encoder
from lensemble.model.objective import JEPAObjective, LossTerms, sketch_for_round, sketch_for_step
from lensemble.model.predictor import Predictor
from lensemble.model.sigreg import make_sketch, sigreg, sigreg_null_mean
from lensemble.model.world_model import (
    GAUGE_KEYS,
    WorldModel,
    architecture,
    build_world_model,
    count_parameters,
    rotate_latent_basis_,
    world_model_from_state,
)

__all__ = [
    "Encoder",
    "Predictor",
    "WorldModel",
    "GAUGE_KEYS",
    "build_world_model",
    "architecture",
    "world_model_from_state",
    "rotate_latent_basis_",
    "count_parameters",
    "make_sketch",
    "sigreg",
    "sigreg_null_mean",
    "JEPAObjective",
    "LossTerms",
    "sketch_for_step",
    "sketch_for_round",
]
