"""The inner training loop shared by ``train_local`` and federated participants.

AdamW with linear warm-up, gradient clipping, and the JEPA objective. The loop counts optimizer
steps, never seconds, so a result never depends on machine speed. Batches come from a seeded
``torch.Generator`` owned by the caller, which is what makes a run bitwise reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.model.objective import PLAIN, AnchorFn, BatchStatistics, JEPAObjective, LossTerms
from lensemble.model.precision import autocast, resolve_precision
from lensemble.model.world_model import WorldModel
from lensemble.training.pooling import freeze_batchnorm

SketchFn = Callable[[int], torch.Tensor]
# stats(i, sketch) -> how step i computes its batch statistics (pooled objective, per-silo control)
StatsFn = Callable[[int, torch.Tensor], BatchStatistics]


class InnerLoop:
    """Runs AdamW steps of the JEPA objective on clips drawn from ``sampler``.

    ``sampler.sample(batch_size, generator)`` must return an object with ``obs`` uint8
    (B, K, 3, H, W) and ``actions`` float32 (B, K-1, A*b). The optimizer state lives here, so a
    participant can persist it across rounds (``state_dict``/``load_state_dict``).
    """

    def __init__(self, model: WorldModel, cfg: LensembleConfig, sampler, *, anchor: AnchorFn | None = None):
        self.model = model
        self.cfg = cfg
        self.sampler = sampler
        self.objective = JEPAObjective(cfg.objective, anchor=anchor, lambda_anc=cfg.gauge.lambda_anc)
        params = model.trainable_parameters()
        self._params = params  # fixed for the loop's life; clipping reuses it every step
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        self.steps_done = 0  # optimizer steps taken by this loop (drives the warm-up)
        self.device = torch.device(getattr(cfg.train, "device", "cpu"))  # [device]
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"train.device={self.device} but torch {torch.__version__} sees no CUDA device here",
                              remediation="train.device=cpu, or on the ray engine give each client a GPU "
                                          "(--client-gpus 1)")
        # [precision] what the forward passes run in: train.precision, or fp32 (warned) where the
        # device has no bf16 matrix units. Weights, optimizer state and gradients stay fp32.
        self.precision = resolve_precision(cfg.train.precision, self.device, field="train.precision")

    def lr_at(self, step: int) -> float:
        warm = self.cfg.train.warmup_steps
        return self.cfg.train.lr * min(1.0, (step + 1) / warm) if warm else self.cfg.train.lr

    def step(self, sketch: torch.Tensor, generator: torch.Generator,
             stats: BatchStatistics = PLAIN) -> tuple[LossTerms, float]:
        """One optimizer step; returns the loss terms and the pre-clip gradient norm."""
        lr = self.lr_at(self.steps_done)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.sampler.sample(self.cfg.train.batch_size, generator)
        obs, actions = batch.obs, batch.actions
        if self.device.type != "cpu":  # [device] batches are drawn on the CPU, trained on the device
            obs, actions = obs.to(self.device), actions.to(self.device)
            sketch = sketch.to(self.device)
        self.model.train()
        if freeze_batchnorm(self.cfg):
            # A frozen encoder (Fork A) is frozen as a function, and FixBN (objective.bn_scope=frozen)
            # normalises with the model's running statistics: either way its BatchNorm layers use
            # their stored statistics and never update them.
            for bn in self.model.encoder.batchnorm_layers():
                bn.eval()
        with autocast(self.precision, self.device):  # [precision] a no-op for fp32
            terms = self.objective(self.model, obs, actions, sketch, stats)
        self.optimizer.zero_grad(set_to_none=True)
        terms.total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.cfg.train.grad_clip)
        self.optimizer.step()
        self.steps_done += 1
        return terms, float(grad_norm)

    def run(self, num_steps: int, *, sketch_fn: SketchFn, generator: torch.Generator,
            on_step: Callable[[int, dict], None] | None = None, log_every: int = 1,
            stats_fn: StatsFn | None = None) -> dict[str, float]:
        """Take ``num_steps`` steps; ``on_step(i, metrics)`` sees every step's scalar metrics.

        Returns the metrics of the last step. ``sketch_fn(i)`` gives the SIGReg sketch of step i
        (fresh per step single-site, constant within a federated round). Collapse diagnostics
        (effective dimension, latent std) cost an eigendecomposition, so they are computed only
        every ``log_every`` steps and on the last one. ``stats_fn(i, sketch)`` says how step i
        computes its batch statistics (default: the plain objective).
        """
        if self.device.type != "cpu":  # [device] on the device for these steps, back on the CPU after
            with _on_device(self.model, self.optimizer, self.device):
                return self._run(num_steps, sketch_fn, generator, on_step, log_every, stats_fn)
        return self._run(num_steps, sketch_fn, generator, on_step, log_every, stats_fn)

    def _run(self, num_steps, sketch_fn, generator, on_step, log_every, stats_fn=None) -> dict[str, float]:
        last: dict[str, float] = {}
        for i in range(num_steps):
            sketch = sketch_fn(i)
            terms, grad_norm = self.step(sketch, generator, stats_fn(i, sketch) if stats_fn else PLAIN)
            last = {f"loss/{'total' if k == 'loss' else k}": v for k, v in terms.as_floats().items()}
            last["train/grad_norm"] = grad_norm
            last["train/lr"] = self.optimizer.param_groups[0]["lr"]
            diagnose = (i + 1) % log_every == 0 or i == num_steps - 1
            if diagnose and terms.latents is not None:
                z = terms.latents.reshape(-1, terms.latents.shape[-1])
                last["gauge/effective_dim"] = effective_dim(z)
                last["train/latent_std"] = latent_std(z)
            if on_step is not None:
                on_step(i, last)
        return last

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps_done": self.steps_done}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = int(state["steps_done"])


# ------------------------------------------------------------------------------------- [device]
def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    # AdamW keeps "step" on the CPU unless capturable/fused (what load_state_dict also does)
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value):
                state[key] = value.to(device)


class _on_device:
    """Model, optimizer state and encoder inputs on ``device`` inside the block; everything back on
    the CPU after it, so callers (the participant's pseudo-gradient, checkpoints, the saved inner
    state) see CPU tensors exactly as on the CPU path. ``Module.to`` keeps each Parameter object
    (it swaps ``.data``), so the optimizer's references stay valid. A forward pre-hook moves the
    encoder's inputs (e.g. an anchor's CPU probe frames) to the device."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device):
        self.model, self.optimizer, self.device = model, optimizer, device
        self._hook = None

    def __enter__(self):
        self.model.to(self.device)
        _move_optimizer_state(self.optimizer, self.device)
        device = self.device

        def inputs_to_device(module, args):
            return tuple(a.to(device) if torch.is_tensor(a) else a for a in args)

        self._hook = self.model.encoder.register_forward_pre_hook(inputs_to_device)
        return self

    def __exit__(self, *exc):
        self._hook.remove()
        self.model.to("cpu")
        _move_optimizer_state(self.optimizer, torch.device("cpu"))
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # leave the GPU to the next process (the coordinator warm-starts on it)
        return False

