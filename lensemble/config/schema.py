"""The validated configuration: ``LensembleConfig`` (pydantic v2), the one home of every default.

Hydra composes the YAML groups under ``configs/`` on top of :func:`schema_defaults` (the field
defaults below, registered as the base of composition by the loader), so a group file holds only
what differs from this schema. The resulting plain dict is validated here. Any bad value raises
:class:`~lensemble.errors.ConfigError` naming the dotted field and the fix, so a typo never silently
becomes a default. docs/configuration.md describes the layers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import to_jsonable_python

from lensemble.config.hashing import json_digest
from lensemble.config.rungs import CUSTOM_RUNG, RUNG_FLAGS, RUNGS
from lensemble.errors import ConfigError


class _Section(BaseModel):
    # strict: no silent coercion ("federation.rounds=true" is not 1, "1e-3" as a string is not a
    # float); an int for a float field is still taken, as the float it names (1 -> 1.0), so YAML
    # and Hydra values such as ``1.0e-3`` or ``outer_lr=1`` validate and dump as before.
    # allow_inf_nan=False: train.lr=inf or a NaN weight is refused here, not found as a NaN loss (issue 47).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# [caps] Upper bounds (issue 47): far above every shipped config (largest: 40 rounds, 500 inner steps, batch
# 128, 2000 episodes per silo, latent 192), low enough that an absurd value (train.batch_size=100000000) is
# a ConfigError naming the field instead of an out-of-memory traceback minutes later. Validation only:
# no dump, so no hash, changes.
MAX_ROUNDS = 100_000
MAX_STEPS = 10_000_000
MAX_BATCH = 16_384
MAX_EPISODES = 1_000_000
MAX_LATENT = 4_096
MAX_REPLICATE = 1_000
#: A run's name is the folder under runs/ (configs/config.yaml: run_dir: runs/${name}): one plain
#: path component, so ``name=../..`` cannot write outside runs/.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


# [device] Where training / planning run: "cpu" (the default, bitwise reproducible) or a CUDA device.
# Added after runs had been hashed: left out of the dump at "cpu" so every earlier hash stays valid.
DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"


# [precision] fp32 | bf16 | auto (lensemble/model/precision.py): bf16 autocast where the device multiplies
# bf16 natively, fp32 master weights and statistics; auto = bf16 where the device has bf16 matrix units,
# fp32 elsewhere, without a warning (the report records which ran). The schema's default stays fp32, the
# value every earlier hash was taken at; the shipped configs choose auto where bf16 was measured no
# worse (configs/config.yaml: eval.precision, docs/model.md "Precision").
Precision = Literal["fp32", "bf16", "auto"]
DEFAULT_PRECISION = "fp32"


def _omit_cpu_device(out: dict) -> dict:
    if out.get("device") == "cpu":
        out.pop("device")
    return out


def _omit_defaults(dump: dict, added: dict) -> dict:
    """``dump`` without the fields of ``added`` that sit at their (added-later) default value."""
    for key, default in added.items():
        # compared as JSON values: a tuple field dumps as a tuple (python mode) or a list (json mode)
        if key in dump and to_jsonable_python(dump[key]) == to_jsonable_python(default):
            dump.pop(key)
    return dump


#: Fields added to a section after hashes had been taken of its dump, with their defaults.
_MODEL_ADDED_DEFAULTS = {"predictor_attention": "window", "input_norm": "pixel", "projector_norm": "layernorm",
                         "inverse_head": 0, "backbone": "vit", "cnn_channels": (8, 16, 32)}
_TRAIN_ADDED_DEFAULTS = {"bn_recalibration_batches": 40, "silo_batches": False, "silo_statistics": "none",
                         "precision": DEFAULT_PRECISION, "replicate": 0}
_OBJECTIVE_ADDED_DEFAULTS = {"lambda_straight": 0.0, "lambda_rollout": 0.0, "lambda_inverse": 0.0,
                             "sigreg_scope": "silo", "bn_scope": "batch", "summary_clips": 512,
                             "bn_cross_gradient": False}
_EVAL_ADDED_DEFAULTS = {"goal_source": "expert", "cost": "l1", "reach_source": "public", "reach_aggregate": "final",
                        "reach_max_gap": 50, "reach_steps": 2000, "precision": DEFAULT_PRECISION}
_DATA_ADDED_DEFAULTS = {"shared_homes": False, "expert": "scripted"}
_FEDERATION_ADDED_DEFAULTS = {"bn_recalibration": "probe", "secure_aggregation": False, "secagg_clip_range": 8.0,
                              "secagg_bits": 24, "secagg_max_norm": None, "secagg_threshold": 2,
                              "update_norm_factor": 10.0, "update_max_norm": None, "aggregate": "mean", "trim": 1,
                              "update_norm_floor": 0.5, "update_max_cancel": 0.5,
                              "summary_max_abs": 1e3, "response_kappa": None}


class ModelConfig(_Section):
    """Encoder (timm ViT or a small CNN) and predictor sizes. Latents are ``latent_dim``-dimensional."""

    img_size: int = Field(64, ge=16, description="square input resolution in pixels")
    backbone: Literal["vit", "cnn"] = Field(
        "vit",
        description="vit: timm ViT pooled on its CLS token; cnn: IMPALA residual CNN whose last grid is "
        "flattened, not pooled (EB-JEPA's encoder at 64 px; docs/model.md)",
    )
    patch_size: int = Field(16, ge=2, description="ViT patch side in pixels (backbone=vit)")
    embed_dim: int = Field(128, ge=16, description="backbone feature width: the ViT's, or the CNN's last linear layer")
    depth: int = Field(3, ge=1, description="ViT blocks (backbone=vit)")
    num_heads: int = Field(4, ge=1, description="ViT heads (backbone=vit)")
    cnn_channels: tuple[int, ...] = Field(
        # IMPALA's (16, 32, 32) narrowed where the grid is largest: 2.5x less CPU (lensemble/model/cnn.py)
        (8, 16, 32), min_length=1, description="width of each stride-2 CNN stage (backbone=cnn)",
    )
    latent_dim: int = Field(64, ge=2, le=MAX_LATENT, description="d: dimension of one latent per frame")
    projector_hidden: int = Field(512, ge=8)
    predictor_width: int = Field(256, ge=8)
    predictor_depth: int = Field(2, ge=1)
    predictor_heads: int = Field(4, ge=1)
    history: int = Field(3, ge=1, description="W: latents the predictor attends to")
    predictor_attention: Literal["window", "banded"] = Field(
        "window",
        description="window: every output sees the last W latents at window positions 0..W-1 "
        "(learned absolute positions); banded: causal attention banded to W keys per block with "
        "rotary positions, so a rollout can cache keys and values (docs/model.md)",
    )
    input_norm: Literal["pixel", "global"] = Field(
        "pixel",
        description="pixel: per-pixel standardisation with mean/std fitted on the frames a fresh model "
        "trains on (persistent buffers); global: the fixed map [0, 1] -> [-1, 1], no fitted statistics "
        "(docs/model.md)",
    )
    projector_norm: Literal["layernorm", "batchnorm"] = Field(
        "layernorm",
        description="normalisation inside the projector after the CLS token: LayerNorm, or BatchNorm1d "
        "(LeWM) whose running statistics are recalibrated before every checkpoint "
        "(train.bn_recalibration_batches)",
    )
    inverse_head: int = Field(
        0, ge=0,
        description="hidden width of the inverse-dynamics head (predicts the action block between two "
        "latents; trained by objective.lambda_inverse); 0 builds no head (docs/model.md)",
    )
    action_dim: int = Field(2, ge=1, description="environment action dimension")
    action_block: int = Field(5, ge=1, description="env steps per latent step (frameskip)")
    action_embed_dim: int = Field(64, ge=4)
    encoder_frozen: bool = Field(False, description="Fork A: never train the encoder")

    @field_validator("cnn_channels", mode="before")
    @classmethod
    def _channels_as_tuple(cls, value):
        # Hydra and YAML give a list; a tuple keeps the frozen config hashable (lru_cache keys)
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _check(self):
        if self.backbone == "vit" and self.img_size % self.patch_size:
            raise ValueError(f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}")
        if self.backbone == "cnn" and min(self.cnn_channels) < 1:
            raise ValueError(f"model.cnn_channels must be positive widths, got {list(self.cnn_channels)}")
        if self.backbone == "vit" and self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.predictor_width % self.predictor_heads:
            raise ValueError("predictor_width must be divisible by predictor_heads")
        if self.predictor_attention == "banded" and (self.predictor_width // self.predictor_heads) % 2:
            raise ValueError("banded attention needs an even head width (rotary positions rotate pairs)")
        return self

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler):
        # Fields added after runs, warm starts and checkpoints had been hashed from this section's
        # dump; leaving them out at their defaults keeps every earlier hash valid.
        return _omit_defaults(handler(self), _MODEL_ADDED_DEFAULTS)


class ObjectiveConfig(_Section):
    """Loss weights and the SIGReg sketch."""

    lambda_pred: float = Field(1.0, ge=0)
    # 0.1 with per-pixel input standardisation; 1.0 planned worse (docs/model.md)
    lambda_sig: float = Field(0.1, ge=0)
    sigreg_directions: int = Field(512, ge=1, description="S: columns of the sketch A (d x S)")
    sigreg_knots: int = Field(17, ge=3)
    sigreg_t_max: float = Field(3.0, gt=0, description="knots span [0, t_max]")
    stop_gradient: bool = Field(True, description="stop-gradient on the target latent")
    lambda_straight: float = Field(
        0.0, ge=0,
        description="temporal straightening: weight of mean 1 - cos(z_{t+1} - z_t, z_{t+2} - z_{t+1}) over each "
        "clip's latents (needs train.clip_len >= 3); rotation invariant, so the gauge machinery is unaffected "
        "(docs/model.md)",
    )
    lambda_rollout: float = Field(
        0.0, ge=0,
        description="multi-step rollout loss: weight of the MSE between the predictor's open-loop rollout from "
        "each clip's first latent (its own predictions fed back, as in planning) and the clip's later latents "
        "(train.clip_len - 1 steps); the same targets as the one-step term, so rotation equivariant like it "
        "(docs/model.md)",
    )
    lambda_inverse: float = Field(
        0.0, ge=0,
        description="inverse dynamics: weight of the MSE between the action block and the head's estimate of it "
        "from each consecutive latent pair (needs model.inverse_head > 0); the head reads latents through the "
        "predictor's in_proj, so it is invariant under the gauge (docs/model.md)",
    )

    # The pooled objective (lensemble/model/pooled.py, docs/federation.md "The pooled objective"): batch
    # statistics computed on one silo's batch penalise every difference between the silos' latents.
    sigreg_scope: Literal["silo", "pooled"] = Field(
        "silo",
        description="silo: SIGReg's characteristic function on the (silo's) batch alone; pooled: under "
        "federation each participant's SIGReg uses the ECF pooled across participants (its live batch with "
        "gradient, the others' summaries taken with the round's global model, fixed)",
    )
    bn_scope: Literal["batch", "pooled", "frozen"] = Field(
        "batch",
        description="with model.projector_norm=batchnorm, what a training batch is normalised with: batch, its "
        "own moments; pooled, moments pooled across participants (the others' summaries, fixed); frozen, the "
        "model's running statistics (FixBN: the warm start's, re-estimated on the public probe each round)",
    )
    summary_clips: int = Field(
        512, ge=1,
        description="clips of its own training data each participant summarises per round for the pooled "
        "statistics (sigreg_scope=pooled or bn_scope=pooled), encoded with the round's global model",
    )
    bn_cross_gradient: bool = Field(
        False,
        description="with bn_scope=pooled: each participant also sends its loss's gradient with respect to the "
        "round's pooled BatchNorm moments (2H floats, one more summary pass) and adds the others' to its own at "
        "every inner step, as SyncBatchNorm's backward does: the mean update of H = 1 is then the data-parallel "
        "one (tests/unit/test_pooled_exact.py). Off by default: held fixed over H = 50 steps this linear term is "
        "unbounded, and the default run's global fell to 2.4 -> 1.3 -> 2.5 effective dimensions with it against "
        "5.0 -> 4.0 -> 4.1 without (docs/federation.md, 'Exact at the first inner step')",
    )

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler):
        return _omit_defaults(handler(self), _OBJECTIVE_ADDED_DEFAULTS)


class TrainConfig(_Section):
    """The inner loop. Budgets are in optimizer steps, never seconds."""

    steps: int = Field(300, ge=1, le=MAX_STEPS)
    batch_size: int = Field(64, ge=1, le=MAX_BATCH, description="clips per step")
    clip_len: int = Field(4, ge=2, description="latent steps per clip (frames at stride action_block)")
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_steps: int = Field(50, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(0, ge=0, description="0: only the final checkpoint")
    threads: int = Field(1, ge=1, description="torch intra-op threads for training (2 was 3-4x slower on a loaded 2-core box)")
    warmstart_steps: int = Field(300, ge=1, le=MAX_STEPS, description="steps of the public-data warm start")
    device: str = Field("cpu", pattern=DEVICE_PATTERN,
                        description="cpu | cuda | cuda:N: where the inner loop (and the warm start) trains; "
                                    "weights travel and are aggregated on the CPU either way (docs/federation.md)")
    bn_recalibration_batches: int = Field(
        40, ge=0,
        description="with model.projector_norm=batchnorm: training batches (of batch_size clips) on "
        "which the BatchNorm running statistics are re-estimated (cumulative average, no grad) "
        "before every checkpoint is saved; 0 keeps the momentum-0.1 running estimates. Ignored "
        "with layernorm",
    )
    # The per-silo central control (issue 31): the federation's batch statistics without any averaging.
    silo_batches: bool = Field(
        False,
        description="centralized training (source pooled) only: each batch is batch_size / C clips from each "
        "of the C silos, in silo order (the control of silo_statistics)",
    )
    silo_statistics: Literal["none", "batchnorm", "sigreg", "both"] = Field(
        "none",
        description="with silo_batches: each silo's share of a batch gets its own train-mode BatchNorm forward "
        "and/or its own SIGReg (at its own N, summed over silos), as each participant computes them under "
        "federation; objective.sigreg_scope / bn_scope = pooled then pool them across the shares with the other "
        "shares' summaries, refreshed every federation.inner_steps steps as a federation would",
    )
    precision: Precision = Field(
        DEFAULT_PRECISION,
        description="fp32 | bf16 | auto: bf16 runs the forward passes of training and the warm start under bf16 "
        "autocast (fp32 weights, optimizer, losses, SIGReg and checkpoints); on a device without bf16 "
        "matrix units it falls back to fp32 with a warning; auto is bf16 where the device has them and "
        "fp32 elsewhere, silently (docs/model.md, 'Precision')",
    )

    # [replicate] Training replicates of a study (issue 44): a replicate r > 0 of a run draws another
    # batch stream (lensemble.config.seeds.batch_labels) and nothing else; left out of the dump at 0.
    replicate: int = Field(
        0, ge=0, le=MAX_REPLICATE,
        description="training replicate: 0 is the run itself; r > 0 trains on another order of the same "
        "batches (the batch stream's seed gets the label ('replicate', r)), with the same warm start, data, "
        "initial weights and evaluation episodes (docs/study.md, 'Replicates')",
    )

    @model_validator(mode="after")
    def _check_silo_statistics(self):
        if self.silo_statistics != "none" and not self.silo_batches:
            raise ValueError("train.silo_statistics needs train.silo_batches=true (a share of the batch per silo)")
        return self

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler):
        return _omit_defaults(_omit_cpu_device(handler(self)), _TRAIN_ADDED_DEFAULTS)


class EnvConfig(_Section):
    """Which stable-worldmodel environment generates the data."""

    id: Literal["swm/TwoRoom-v1", "swm/PushT-v1", "swm/ReacherDMControl-v0"] = "swm/TwoRoom-v1"
    max_episode_steps: int = Field(100, ge=2)


class DataConfig(_Section):
    """Collection, silos and the public probe."""

    root: str = Field("data", description="folder for shards (relative to the run or absolute)")
    num_silos: int = Field(2, ge=1)
    episodes_per_silo: int = Field(40, ge=1, le=MAX_EPISODES)
    steps_per_episode: int = Field(100, ge=2)
    partition_factor: str = Field("agent.color", description="factor of variation defining silos")
    severity: float = Field(1.0, ge=0, le=1, description="0 = IID, 1 = disjoint factor values")
    shared_homes: bool = Field(
        False,
        description="more silos than silo values at severity > 0: silo c owns the value its turn in the "
        "shuffled pool gives it, so silos c and c + |pool| share one home value (e.g. 4 silos, two per room "
        "of agent.region) instead of a ConfigError",
    )
    random_action_share: float = Field(0.5, ge=0, le=1)
    expert: Literal["scripted", "goal_pusher"] = Field(
        "scripted",
        description="the collection's expert: each env's scripted one (TwoRoom waypoints, PushT block seeker, "
        "Reacher PD to poses), or goal_pusher (PushT only: pushes the block to a sequence of goal poses, "
        "lensemble/envs/pusht_pusher.py). The strict protocol's goal expert is the scripted one either way",
    )
    heldout_episodes: int = Field(10, ge=0, le=MAX_EPISODES, description="held-out episodes per silo (episode split)")
    probe_frames: int = Field(256, ge=1, description="|P|: public probe frames")
    public_episodes: int = Field(40, ge=0, le=MAX_EPISODES, description="public-corpus episodes (warm start data)")
    workers: int = Field(2, ge=1, description="collection processes")

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler):
        return _omit_defaults(handler(self), _DATA_ADDED_DEFAULTS)


# The default gauge is the ladder's first rung (no gauge control); its flags are read from the rung
# table so the schema and the table cannot disagree about what "naive" means.
_DEFAULT_RUNG = RUNGS[0]
_DEFAULT_FLAGS = RUNG_FLAGS[_DEFAULT_RUNG]


class GaugeConfig(_Section):
    """Gauge control; the ablation ladder's rungs are presets of these flags (config/rungs.py)."""

    rung: Literal[RUNGS + (CUSTOM_RUNG,)] = Field(_DEFAULT_RUNG, description="a rung of config/rungs.py, or custom")
    shared_sketch: bool = _DEFAULT_FLAGS["shared_sketch"]
    backstop: bool = _DEFAULT_FLAGS["backstop"]
    anchor: Literal["none", "A", "B"] = _DEFAULT_FLAGS["anchor"]
    lambda_anc: float = Field(_DEFAULT_FLAGS["lambda_anc"], ge=0, description="weight of the anchor loss")
    anchor_landmarks: int = Field(128, ge=1, description="k: probe landmarks; must be >= latent_dim")
    # 1e-10: the cross-covariance conditions like the product of both embeddings (docs/gauge.md)
    singular_floor: float = Field(1e-10, gt=0, description="relative floor on Procrustes singular values")
    distill: bool = _DEFAULT_FLAGS["distill"]
    distill_steps: int = Field(50, ge=1)
    distill_lr: float = Field(1e-3, gt=0)


class FederationConfig(_Section):
    """DiLoCo rounds."""

    rounds: int = Field(3, ge=1, le=MAX_ROUNDS)
    inner_steps: int = Field(50, ge=1, le=MAX_STEPS, description="H: local AdamW steps per round")
    outer_lr: float = Field(0.7, gt=0)
    outer_momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = True
    # The pooled objective's best-response overshoot (lensemble/training/response.py, issue 43): each
    # participant closes the pooled gap as if the others stood still, so the mean update overshoots by
    # 1 + κ(C − 1).
    response_kappa: float | None = Field(
        None, ge=0, le=1,
        description="κ, how far one participant's round moves the other participants' latents relative to its "
        "own (measured by examples/measure_kappa.py); when set the outer learning rate is outer_lr / (1 + κ(C − 1)), "
        "C = data.num_silos, which undoes the linearised overshoot of averaging C best responses. None: outer_lr "
        "as given",
    )
    min_participants: int = Field(2, ge=1, description="quorum")
    round_timeout_s: float = Field(600.0, gt=0)
    round_retries: int = Field(1, ge=0)
    quantize_int8: bool = False
    max_update_mb: float = Field(512.0, gt=0)
    warmstart: str | None = Field(None, description="warm-start checkpoint folder; None: train one")
    state_dir: str | None = Field(None, description="participants' local state (default <run>/nodes)")
    bn_recalibration: Literal["probe", "none"] = Field(
        "probe",
        description="with model.projector_norm=batchnorm: probe: the coordinator re-estimates the global "
        "encoder's BatchNorm statistics on the public probe after every outer step (and distillation) "
        "and commits them, and each participant does the same after its inner steps before embedding "
        "the probe, so every party's statistics come from the same public frames; none: the global "
        "keeps the warm start's statistics (docs/model.md)",
    )
    # [secagg] Flower SecAgg+ under the outer step (docs/federation.md, "Secure aggregation"). The
    # coordinator then sees only the sum of the released updates; its error bound is stated there.
    secure_aggregation: bool = Field(False, description="mask every released Δ with Flower's SecAgg+; the "
                                     "coordinator reconstructs only the sum (Flower engines only)")
    # 8.0 (Flower's default): a clipped, noised DP update at the default σ=1 stays inside it up to 7σ
    # (clip_norm·(1+7σ) = 8), and a plain Δ (|Δ_i| ≲ H·lr ≈ 0.05 at the defaults) by > 100x.
    secagg_clip_range: float = Field(8.0, gt=0, description="c: every coordinate of a released Δ must lie in "
                                     "[-c, c] (checked on the participant; SecAgg+ quantises that range)")
    # 24 bits: the mean's coordinates are off by < 2c/2^b = 9.5e-7 at c=8, and C·2^b < 2^32 (Flower's
    # mask modulus) leaves room for 255 participants; 22 (Flower's default) would allow 1023 at 4x the error.
    secagg_bits: int = Field(24, ge=8, le=30, description="b: [-c, c] is quantised to 2^b levels "
                             "(stochastic rounding); each coordinate of the mean is off by < 2c/2^b")
    secagg_max_norm: float | None = Field(None, gt=0, description="B: L2 bound on each released Δ, checked on "
                                          "the participant before masking and as C·B on the sum; None: the run's "
                                          "step bound (federation/robust.py), at most c·√n")
    # 2: the fewest a sum can hide behind, so the most dropouts the protocol tolerates (C - 2).
    secagg_threshold: int = Field(2, ge=2, description="t: SecAgg+ shares needed to reconstruct a "
                                  "participant's secrets; a round finishes only while >= t participants remain")

    # [robust] The coordinator's defence against one participant's update (federation/robust.py,
    # docs/federation.md "Threat model / robust aggregation"). 10: honest norms measured within a round
    # differ by <= 1.7x (experiment=micro, rungs 1, 3, 5; they fall between rounds, which never trips it), so
    # 10 leaves >= 5x for more heterogeneous silos while an accepted update moves the mean by <= 10/C of one.
    update_norm_factor: float | None = Field(10.0, gt=1, description="a reply with ‖Δ‖₂ above this multiple of "
                                             "the round's reference norm (lower median of this round's and the last "
                                             "3 rounds' norms) is dropped; None: the step bound alone")
    update_max_norm: float | None = Field(None, gt=0, description="absolute ceiling on ‖Δ‖₂ per reply; None: the "
                                          "run's step bound (H AdamW steps at train.lr, the backstop's rotation, "
                                          "DP's clip and noise)")
    aggregate: Literal["mean", "median", "trimmed_mean"] = Field(
        "mean", description="mean (DiLoCo) | median | trimmed_mean, per coordinate over the accepted updates; the "
        "robust ones need individual updates (not under secure_aggregation)")
    trim: int = Field(1, ge=1, description="aggregate=trimmed_mean: values dropped at each end per coordinate; "
                      "a round then needs >= 2·trim + 1 accepted updates")
    # [robust] issue 47: a floor on the norm bound that no participant can lower, and a direction screen.
    # 0.5: 2x the largest honest fraction of the step bound measured (0.23, micro, backstop rung).
    update_norm_floor: float | None = Field(0.5, gt=0, le=1, description="the round's norm bound is never below "
                                            "this fraction of the step bound (config and global alone, so a "
                                            "participant sending a near-zero update cannot get the others dropped); "
                                            "the step bound itself under DP; None: no floor")
    # 0.5: a -9x flipped update cancelled 0.98-2.97 of the others' step on micro, honest ones <= 0.05 (issue 47).
    update_max_cancel: float | None = Field(0.5, gt=0, le=1, description="direction screen: an update that "
                                            "cancels more than this fraction of the others' step (their mean, or "
                                            "median with >= 3 others) along its direction is dropped; with 2 updates "
                                            "both are (no way to tell which is hostile); off under DP and secure "
                                            "aggregation; None: off")
    # 1e3: honest summary values measured <= 1.8 (micro: BatchNorm input means 1.8, projection means 0.85).
    summary_max_abs: float = Field(1e3, gt=0, description="M: on the plaintext path a pooled-objective summary's "
                                   "projection means and BatchNorm input means and variances must lie in [-M, M] "
                                   "(squared means <= M²), besides |ECF| <= 1 and variances >= 0 "
                                   "(federation/summary_checks.py); the SecAgg+ path uses secagg_clip_range")

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler):
        return _omit_defaults(handler(self), _FEDERATION_ADDED_DEFAULTS)


class PrivacyConfig(_Section):
    """Update-level DP (off by default)."""

    enabled: bool = False
    clip_norm: float = Field(1.0, gt=0)
    noise_multiplier: float = Field(1.0, ge=0)
    target_epsilon: float | None = Field(None, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)


class EvalConfig(_Section):
    """Latent MPC and the evaluation ladder (defaults follow the published protocol)."""

    planner: Literal["cem", "icem", "mppi"] = "cem"
    horizon: int = Field(5, ge=1)
    receding_horizon: int = Field(5, ge=1)
    num_samples: int = Field(300, ge=2)
    iterations: int = Field(30, ge=1)
    topk: int = Field(30, ge=1)
    mppi_temperature: float = Field(0.5, gt=0)
    episodes: int = Field(50, ge=1, le=MAX_EPISODES)
    goal_offset: int = Field(25, ge=1, description="goal = the state this many env steps ahead (of goal_source)")
    goal_source: Literal["expert", "dataset"] = Field(
        "expert",
        description="expert: the strict protocol, the goal is where the noise-free goal expert is goal_offset "
        "steps after the episode's start; dataset: the published (LeWM) one, start and goal are the states at "
        "t0 and t0 + goal_offset of a fresh held-out episode of the collection's behaviour policy (noisy "
        "expert mixed with held random actions, data.random_action_share), t0 uniform in "
        "[0, data.steps_per_episode - goal_offset] (docs/evaluation.md)",
    )
    budget: int = Field(50, ge=1, description="env steps allowed per episode")
    cost: Literal["l1", "reachability"] = Field(
        "l1",
        description="the planner's energy: l1, the L1 distance between the final predicted latent and the goal "
        "latent; reachability, a head r(z, g) fitted on the checkpoint's frozen latents to the time gap between "
        "frames of logged trajectories (lensemble/model/reachability.py, docs/model.md)",
    )
    reach_source: Literal["public", "pooled"] = Field(
        "public",
        description="trajectories the reachability head is fitted on: public, the public corpus (no silo data, "
        "what a federation's evaluator holds); pooled, every silo's train split (what a central model saw)",
    )
    reach_aggregate: Literal["final", "min"] = Field(
        "final",
        description="how the head scores a rollout: final, r at the last predicted latent; min, the closest "
        "approach over the horizon (success is checked at every env step, so passing the goal counts)",
    )
    reach_max_gap: int = Field(50, ge=1, description="largest time gap (env steps) of a reachability pair")
    reach_steps: int = Field(2000, ge=1, description="optimizer steps of the reachability fit")
    seed: int = 0
    heldout_factors: list[str] = Field(default_factory=list)
    device: str = Field("cpu", pattern=DEVICE_PATTERN,
                        description="cpu | cuda | cuda:N: where closed-loop encoding and planning run "
                                    "(the ladder stays on the CPU)")
    precision: Precision = Field(
        DEFAULT_PRECISION,
        description="fp32 | bf16 | auto: closed-loop encoding and planning under bf16 autocast (the cost in fp32; "
        "the ladder and the reachability fit stay fp32); bf16 falls back to fp32 with a warning on a device "
        "without bf16 matrix units, auto (the shipped default, configs/config.yaml) runs bf16 where the "
        "device has them and fp32 elsewhere, silently; the report says which ran (docs/model.md, 'Precision')",
    )

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler):
        return _omit_defaults(_omit_cpu_device(handler(self)), _EVAL_ADDED_DEFAULTS)

    @model_validator(mode="after")
    def _check(self):
        if self.topk > self.num_samples:
            raise ValueError(f"topk {self.topk} exceeds num_samples {self.num_samples}")
        if self.receding_horizon > self.horizon:
            raise ValueError("receding_horizon cannot exceed horizon")
        return self


class LensembleConfig(_Section):
    """The whole run configuration."""

    name: str = Field("tiny", pattern=NAME_PATTERN, description="the run's name: its folder under runs/ "
                      "(letters, digits, '.', '_', '-'; no path separators, not '..')")
    root_seed: int = 0
    run_dir: str = "runs/default"
    model: ModelConfig = ModelConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    train: TrainConfig = TrainConfig()
    env: EnvConfig = EnvConfig()
    data: DataConfig = DataConfig()
    gauge: GaugeConfig = GaugeConfig()
    federation: FederationConfig = FederationConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _cross_checks(self):
        if self.gauge.anchor != "none" and self.gauge.anchor_landmarks < self.model.latent_dim:
            raise ValueError(
                f"gauge.anchor_landmarks={self.gauge.anchor_landmarks} < model.latent_dim="
                f"{self.model.latent_dim}: k >= d landmarks are needed to pin the frame"
            )
        if self.gauge.anchor_landmarks > self.data.probe_frames and self.gauge.anchor != "none":
            raise ValueError("gauge.anchor_landmarks cannot exceed data.probe_frames")
        if self.objective.lambda_straight > 0 and self.train.clip_len < 3:
            raise ValueError("objective.lambda_straight needs train.clip_len >= 3 (a curvature spans three latents)")
        if self.objective.lambda_inverse > 0 and self.model.inverse_head == 0:
            raise ValueError("objective.lambda_inverse needs an inverse-dynamics head: set model.inverse_head "
                             "(its hidden width, e.g. 256)")
        if self.federation.min_participants > self.data.num_silos:
            raise ValueError("federation.min_participants exceeds data.num_silos")
        if self.data.expert == "goal_pusher" and self.env.id != "swm/PushT-v1":
            raise ValueError(f"data.expert=goal_pusher pushes PushT's block; env.id is {self.env.id}")
        if self.eval.goal_source == "dataset" and self.eval.goal_offset > self.data.steps_per_episode:
            # t0 + goal_offset must lie inside one behaviour episode of data.steps_per_episode steps
            raise ValueError(f"eval.goal_offset={self.eval.goal_offset} exceeds data.steps_per_episode="
                             f"{self.data.steps_per_episode}: a dataset goal lies inside one episode")
        return self

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON of the whole config (sorted keys)."""
        return json_digest(self.model_dump(mode="json"))


def schema_defaults(section: type[BaseModel] = LensembleConfig) -> dict:
    """Every field of ``section`` at its default, as a plain (JSON-like) nested dict.

    This is the base layer of Hydra composition, so every key exists before a group file or an
    override touches it (``gauge.lambda_anc=10`` needs no ``+``). It is built from the field
    defaults, not from ``model_dump``: the dump omits keys at their default to keep old hashes
    (``model.predictor_attention``), and the base must still contain them.
    """
    out = {}
    for name, field in section.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, _Section):
            out[name] = schema_defaults(field.annotation)
        else:
            out[name] = to_jsonable_python(field.get_default(call_default_factory=True))
    return out


def validate_config(raw: dict) -> LensembleConfig:
    """Validate a plain dict (e.g. a composed Hydra config) into a ``LensembleConfig``.

    Raises ConfigError naming every offending dotted field.
    """
    try:
        return LensembleConfig.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "<root>"
            problems.append(f"{field}: {err['msg']}")
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        raise ConfigError(
            "invalid configuration: " + "; ".join(problems),
            remediation=f"fix {'.'.join(str(p) for p in first) or 'the config'} in configs/ or on the command line",
            fields=[".".join(str(p) for p in e["loc"]) for e in exc.errors()],
        ) from None
