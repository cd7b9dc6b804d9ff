"""Environments: the stable-worldmodel adapter, factors of variation and collection policies."""

from lensemble.envs.adapter import (
    NATIVE_SIZE,
    EnvAdapter,
    EnvInfo,
    env_info,
    make_env,
    resize_frame,
    set_single_thread,
)
from lensemble.envs.factors import (
    DEFAULT_PARTITION_FACTOR,
    FactorSpec,
    factor_catalog,
    factor_spec,
    supported_envs,
)
from lensemble.envs.policies import HeldRandomPolicy, MixedPolicy, make_expert

__all__ = [
    "NATIVE_SIZE",
    "EnvAdapter",
    "EnvInfo",
    "env_info",
    "make_env",
    "resize_frame",
    "set_single_thread",
    "DEFAULT_PARTITION_FACTOR",
    "FactorSpec",
    "factor_catalog",
    "factor_spec",
    "supported_envs",
    "HeldRandomPolicy",
    "MixedPolicy",
    "make_expert",
]
