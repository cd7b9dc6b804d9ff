"""Cross-field checks a federated run needs beyond the schema (cheap: config only, no torch).

The coordinator runs them before it touches the run folder, and ``lensemble config`` runs them
too, so a config the command calls valid is one ``run`` accepts.
"""

from __future__ import annotations

from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError


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


__all__ = ["check_federation_config"]
