"""Cross-field checks a federated run needs beyond the schema (cheap: config only, no torch).

The coordinator runs them before it touches the run folder, and ``lensemble config`` runs them
too, so a config the command calls valid is one ``run`` accepts.
"""

from __future__ import annotations

from lensemble.config.schema import LensembleConfig, PrivacyConfig
from lensemble.errors import ConfigError

#: Flower's SecAgg+ mask modulus (``modulus_range``): its default and its largest allowed value.
MOD_BITS = 32
#: A DP-noised coordinate must fit the SecAgg+ range up to this many noise standard deviations: a
#: Gaussian exceeds 7σ with probability 2.6e-12, about 5e-6 per release of 2M coordinates.
DP_TAIL_SIGMAS = 7.0
#: Engines that can run SecAgg+ (the framework-free one has no Flower grid to run it on).
SECURE_ENGINES = ("ray", "flower-inprocess")


def check_federation_config(cfg: LensembleConfig) -> None:
    """ConfigError naming the fields when the federation settings contradict each other.

    With privacy on, participants withhold their probe embeddings (only the clipped, noised Δ is
    covered by ε), so a rung that needs them (``gauge.distill``) is refused.
    """
    if cfg.privacy.enabled and cfg.gauge.distill:
        raise ConfigError(
            "gauge.distill needs the participants' probe embeddings, which privacy.enabled withholds "
            "(ε covers only the clipped, noised pseudo-gradient)",
            remediation="use a rung without distillation (gauge=anchor or lower) with privacy=dp, "
                        "or privacy=none for rung 5")
    pooled = [f"objective.{k}=pooled" for k in ("sigreg_scope", "bn_scope") if getattr(cfg.objective, k) == "pooled"]
    if pooled and cfg.privacy.enabled:
        # The summaries are functions of silo data outside the DP pipeline: releasing them would
        # make ε a lie. Clipping and noising them in the accountant is not built (docs/federation.md).
        raise ConfigError(
            f"{' and '.join(pooled)} releases each silo's summary of its latents (characteristic-function and "
            "BatchNorm moments) every round, which privacy.enabled's ε does not cover",
            remediation="use objective.bn_scope=frozen (FixBN needs no exchange) with privacy=dp, or privacy=none "
                        "for the pooled objective")
    if cfg.objective.sigreg_scope == "pooled" and cfg.federation.secure_aggregation \
            and cfg.federation.secagg_clip_range < 1.0:
        # Under SecAgg+ the summaries are masked like updates (federation/pooling.py): their ECF
        # means of cos and sin lie in [-1, 1], which the coordinate range must hold.
        raise ConfigError(
            f"federation.secagg_clip_range={cfg.federation.secagg_clip_range:g} < 1: the pooled ECF summary's "
            "means of cos and sin lie in [-1, 1] and would not fit the SecAgg+ coordinate range",
            remediation="set federation.secagg_clip_range >= 1 with objective.sigreg_scope=pooled")
    f = cfg.federation
    if f.aggregate != "mean" and f.secure_aggregation:
        # [robust] a median or trimmed mean sorts the individual updates; SecAgg+ reveals only their sum
        raise ConfigError(f"federation.aggregate={f.aggregate} needs the individual updates, which "
                          "federation.secure_aggregation hides (the coordinator sees only their sum)",
                          remediation="use federation.aggregate=mean with secure aggregation (the secure-sum "
                                      "bound federation.secagg_max_norm then limits the damage), or turn it off")
    if f.aggregate == "trimmed_mean" and cfg.data.num_silos < 2 * f.trim + 1:
        raise ConfigError(f"federation.aggregate=trimmed_mean with federation.trim={f.trim} needs at least "
                          f"{2 * f.trim + 1} silos, data.num_silos is {cfg.data.num_silos}",
                          remediation="lower federation.trim, add silos, or use federation.aggregate=median")
    check_secure_config(cfg)


def check_secure_config(cfg: LensembleConfig) -> None:
    """ConfigError naming the fields when secure aggregation cannot work with this config."""
    f = cfg.federation
    if not f.secure_aggregation:
        return
    levels = 1 << f.secagg_bits
    most = ((1 << MOD_BITS) - 1) // levels
    fix = "set it in the config or on the command line (docs/federation.md, 'Secure aggregation')"
    if cfg.data.num_silos < 2:
        raise ConfigError("federation.secure_aggregation needs data.num_silos >= 2: a sum of one update is "
                          "that update", remediation="add a silo or turn secure aggregation off")
    if f.secagg_threshold > cfg.data.num_silos:
        raise ConfigError(f"federation.secagg_threshold={f.secagg_threshold} exceeds data.num_silos="
                          f"{cfg.data.num_silos}: no round could ever be unmasked",
                          remediation="lower federation.secagg_threshold (>= 2)")
    if cfg.data.num_silos > most:
        raise ConfigError(f"{cfg.data.num_silos} participants x 2^{f.secagg_bits} quantisation levels do not fit "
                          f"Flower's 2^{MOD_BITS} mask modulus (at most {most} participants)",
                          remediation=f"lower federation.secagg_bits; {fix}")
    if cfg.privacy.enabled:
        need = dp_clip_range(cfg.privacy)
        if f.secagg_clip_range < need:
            raise ConfigError(
                f"federation.secagg_clip_range={f.secagg_clip_range:g} is below clip_norm·(1 + "
                f"{DP_TAIL_SIGMAS:g}σ) = {need:g}: noised coordinates would fall outside the SecAgg+ "
                "range and participants would refuse to release",
                remediation=f"set federation.secagg_clip_range >= {need:g}")


def dp_clip_range(privacy: PrivacyConfig) -> float:
    """The smallest coordinate range that holds a clipped, noised DP update up to 7σ."""
    return float(privacy.clip_norm) * (1.0 + DP_TAIL_SIGMAS * float(privacy.noise_multiplier))

__all__ = ["check_federation_config", "check_secure_config", "dp_clip_range", "MOD_BITS", "DP_TAIL_SIGMAS",
           "SECURE_ENGINES"]
