"""Latent model-predictive control: sampling planners over a world model's batched rollout.

``Planner.plan`` searches for an action sequence whose predicted final latent is closest, in L1,
to a goal latent (DESIGN.md §7). It never sees pixels or the environment: it only calls
``rollout_fn`` once per iteration with every candidate of every environment stacked into one
batch, which is what keeps planning fast (one model call of B·S sequences instead of S or B·S
small calls).

Families (all share sampling, clipping, the cost and the bookkeeping):

* ``"cem"`` — cross-entropy method: sample from a diagonal Gaussian over the whole sequence,
  refit mean and std to the ``topk`` cheapest candidates.
* ``"icem"`` — improved CEM (Pinneri et al., 2020): time-correlated ("colored", power spectrum
  ∝ 1/f^β) noise, so samples are smooth in time and explore further per unit variance; the best
  elites of the previous iteration are re-evaluated instead of being forgotten; mean and std move
  with momentum. The population is kept constant so the sample budget equals CEM's.
* ``"mppi"`` — model-predictive path integral: the new mean is the softmax(−cost/temperature)
  weighted average of *all* candidates; the std stays at ``init_std`` (``topk`` is unused).

Every family also evaluates the current mean (candidate 0) and remembers the cheapest sequence
seen over all iterations; that sequence is what ``plan`` returns, so the returned cost is an
actual model evaluation, and it can only improve with more iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from lensemble.config.seeds import derive
from lensemble.errors import ConfigError, EvaluationError
from lensemble.model.precision import autocast, resolve_precision

Family = Literal["cem", "icem", "mppi"]
FAMILIES: tuple[str, ...] = ("cem", "icem", "mppi")

RolloutFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``cost_fn(predicted (B, S, H, d), goal (B, 1, d)) -> (B, S)``: the energy of every candidate
#: (lower is better); the default is :func:`latent_l1_cost`.
CostFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PlanResult:
    """Output of :meth:`Planner.plan` for B environments.

    Attributes:
        actions: (B, H, A) the cheapest sequence seen, inside the action bounds.
        cost: (B,) its L1 energy (latent units), as computed by the planner's cost.
        mean: (B, H, A) the final sampling mean (what :meth:`Planner.next_init` shifts).
        std: (B, H, A) the final sampling std.
        cost_history: (iterations, B) the best cost seen after each iteration (non-increasing).
        family: the planner family.
        evaluations: candidate sequences evaluated per environment (iterations · num_samples).
    """

    actions: torch.Tensor
    cost: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    cost_history: torch.Tensor
    family: str
    evaluations: int


def latent_l1_cost(
    predicted: torch.Tensor, goal: torch.Tensor, *, over_horizon: bool = False
) -> torch.Tensor:
    """L1 energy between predicted latents and a goal latent.

    Args:
        predicted: (..., H, d) predicted latents z_1..z_H.
        goal: (..., d) goal latent, broadcastable against ``predicted[..., -1, :]``.
        over_horizon: if True, sum the energy over all H steps (rewards reaching the goal early);
            otherwise only the final latent counts.

    Returns:
        (...) cost: the sum over the d latent dimensions of |z − z_goal| (float32).
    """
    if over_horizon:
        return (predicted.float() - goal.float().unsqueeze(-2)).abs().sum((-2, -1))
    # Only the final step matters: slice before subtracting (H times less work).
    return (predicted[..., -1, :].float() - goal.float()).abs().sum(-1)


def shift_plan(actions: torch.Tensor, n: int, *, fill: float | torch.Tensor = 0.0) -> torch.Tensor:
    """Drop the first ``n`` steps of a (B, H, A) plan and append ``n`` steps of ``fill``.

    After executing n actions of a receding-horizon plan, the rest of it is a good initial mean
    for the next call. ``fill`` is a scalar or an (A,) tensor (e.g. the middle of the bounds).
    """
    if actions.ndim != 3:
        raise EvaluationError(f"actions must be (B, H, A), got shape {tuple(actions.shape)}")
    b, h, a = actions.shape
    if not 0 <= n <= h:
        raise ConfigError(f"cannot shift a plan of horizon {h} by {n} steps (need 0 <= n <= H)")
    tail = torch.as_tensor(fill, dtype=actions.dtype, device=actions.device).expand(b, n, a)
    return torch.cat([actions[:, n:], tail], dim=1)


def _colored_noise_scale(horizon: int, beta: float) -> tuple[torch.Tensor, float]:
    """Per-frequency amplitudes and the std of the resulting time series (see ``_noise``).

    A real series of length H is the inverse real FFT of H//2+1 complex coefficients. Giving the
    coefficient at frequency f an amplitude ∝ f^(-β/2) makes the power spectrum ∝ 1/f^β. The zero
    frequency gets the amplitude of the lowest non-zero one (a cutoff, else it would be infinite).
    DC and Nyquist coefficients are real-only, so their real part is scaled by √2; with β = 0 this
    makes the series exactly white. The marginal variance of every time step is then
    2·(s_0² + 2·Σ_mid s_k² + s_nyq²)/H², which we divide out so every step has unit std.
    """
    n_freq = horizon // 2 + 1
    freqs = torch.arange(n_freq, dtype=torch.float64) / horizon
    freqs[0] = 1.0 / horizon
    amp = freqs.pow(-beta / 2.0)
    amp = amp / amp[0]  # overall scale is irrelevant; keeps numbers near 1
    real_only = torch.zeros(n_freq, dtype=torch.bool)
    real_only[0] = True
    if horizon % 2 == 0:
        real_only[-1] = True
    amp = torch.where(real_only, amp * math.sqrt(2.0), amp)
    # x_t = (1/H)·[Re X_0 + 2·Σ_mid Re(X_k e^{2πikt/H}) + Re X_nyq·(−1)^t]: a real-only term adds
    # amp² to H²·Var(x_t), every other frequency adds (2·amp)² (cos and sin parts together).
    factor = torch.where(real_only, torch.ones_like(amp), torch.full_like(amp, 4.0))
    var = float((factor * amp**2).sum()) / horizon**2
    return amp.float(), math.sqrt(var)


class Planner:
    """Batched sampling planner over latent rollouts (CEM, iCEM or MPPI).

    Args:
        family: "cem" (default), "icem" or "mppi".
        horizon: H, latent steps planned (each is one action of the predictor's action space,
            i.e. already grouped by ``action_block``).
        num_samples: S, candidate sequences per environment per iteration (>= 2).
        iterations: refinement iterations per plan.
        topk: elites refit by CEM/iCEM (<= num_samples; unused by MPPI).
        action_dim: A, dimension of one action.
        action_low, action_high: scalar or (A,) bounds; every candidate is clipped into them.
        seed: seeds the planner's own torch generator (ignored if ``generator`` is given).
        generator: an explicit ``torch.Generator``; noise is drawn on its device.
        init_std: initial sampling std in action units (MPPI keeps it fixed).
        mppi_temperature: λ in softmax(−cost/λ), in cost (latent L1) units.
        icem_colored_noise_beta: β of the 1/f^β noise spectrum (0 = white, 2 ≈ Brownian-like).
        icem_keep_elites: elites of the previous iteration re-evaluated in the next one.
        icem_momentum: weight of the previous mean/std in iCEM's update (0 = plain refit).
        warm_start: if True, :meth:`next_init` returns the shifted previous mean; else None.
        cost_over_horizon: sum the L1 energy over all H steps instead of the final one only.

    The planner holds no per-episode state: the only thing that advances between calls is the
    random generator, so two planners built with the same seed and called with the same inputs
    return identical plans (on the same device class).
    """

    def __init__(
        self,
        family: Family = "cem",
        horizon: int = 5,
        num_samples: int = 300,
        iterations: int = 30,
        topk: int = 30,
        action_dim: int = 2,
        action_low: float | torch.Tensor = -1.0,
        action_high: float | torch.Tensor = 1.0,
        *,
        seed: int = 0,
        generator: torch.Generator | None = None,
        init_std: float = 1.0,
        mppi_temperature: float = 0.5,
        icem_colored_noise_beta: float = 2.0,
        icem_keep_elites: int = 5,
        icem_momentum: float = 0.1,
        warm_start: bool = True,
        cost_over_horizon: bool = False,
    ) -> None:
        if family not in FAMILIES:
            raise ConfigError(f"unknown planner family {family!r}; choose one of {FAMILIES}")
        for name, value, minimum in (
            ("horizon", horizon, 1),
            ("num_samples", num_samples, 2),
            ("iterations", iterations, 1),
            ("topk", topk, 1),
            ("action_dim", action_dim, 1),
            ("icem_keep_elites", icem_keep_elites, 0),
        ):
            if isinstance(value, bool) or int(value) != value or value < minimum:
                raise ConfigError(f"planner {name} must be an integer >= {minimum}, got {value}")
        if topk > num_samples:
            raise ConfigError(f"planner topk {topk} exceeds num_samples {num_samples}")
        if family == "icem" and (icem_keep_elites > topk or icem_keep_elites >= num_samples):
            raise ConfigError(f"icem_keep_elites {icem_keep_elites} must be <= topk {topk} and < num_samples")
        for name, value in (("init_std", init_std), ("mppi_temperature", mppi_temperature)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"planner {name} must be a positive finite number, got {value}")
        if not (math.isfinite(icem_colored_noise_beta) and icem_colored_noise_beta >= 0):
            raise ConfigError(f"icem_colored_noise_beta must be >= 0, got {icem_colored_noise_beta}")
        if not 0.0 <= icem_momentum < 1.0:
            raise ConfigError(f"icem_momentum must be in [0, 1), got {icem_momentum}")

        low = torch.as_tensor(action_low, dtype=torch.float32).flatten()
        high = torch.as_tensor(action_high, dtype=torch.float32).flatten()
        try:
            low, high = (t.expand(action_dim).clone() for t in (low, high))
        except RuntimeError as exc:
            raise ConfigError(f"action bounds must be scalars or have {action_dim} entries") from exc
        if not (torch.isfinite(low).all() and torch.isfinite(high).all() and (low < high).all()):
            raise ConfigError(f"action bounds must be finite with low < high, got {low} / {high}")

        self.family: str = family
        self.horizon = int(horizon)
        self.num_samples = int(num_samples)
        self.iterations = int(iterations)
        self.topk = int(topk)
        self.action_dim = int(action_dim)
        self.action_low = low
        self.action_high = high
        self.init_std = float(init_std)
        self.mppi_temperature = float(mppi_temperature)
        self.icem_colored_noise_beta = float(icem_colored_noise_beta)
        self.icem_keep_elites = int(icem_keep_elites)
        self.icem_momentum = float(icem_momentum)
        self.warm_start = bool(warm_start)
        self.cost_over_horizon = bool(cost_over_horizon)
        self.seed = int(seed)
        self._generator = generator
        self._generators: dict[str, torch.Generator] = {}
        self._noise_amp, self._noise_std = _colored_noise_scale(self.horizon, self.icem_colored_noise_beta)

    @classmethod
    def from_config(
        cls,
        eval_cfg,
        *,
        action_dim: int,
        action_low: float | torch.Tensor,
        action_high: float | torch.Tensor,
        seed: int | None = None,
        **overrides,
    ) -> "Planner":
        """Build from an ``EvalConfig`` (planner, horizon, num_samples, iterations, topk, ...)."""
        kwargs = dict(
            seed=eval_cfg.seed if seed is None else seed,
            mppi_temperature=eval_cfg.mppi_temperature,
        )
        kwargs.update(overrides)
        return cls(
            eval_cfg.planner,
            eval_cfg.horizon,
            eval_cfg.num_samples,
            eval_cfg.iterations,
            eval_cfg.topk,
            action_dim,
            action_low,
            action_high,
            **kwargs,
        )

    # ----------------------------------------------------------------------------------------

    @property
    def midpoint(self) -> torch.Tensor:
        """(A,) centre of the action box: the prior mean when no warm start is given."""
        return (self.action_low + self.action_high) / 2

    def reset(self, seed: int | None = None) -> None:
        """Restart the random stream (optionally with a new seed)."""
        if seed is not None:
            self.seed = int(seed)
        self._generators.clear()

    def next_init(self, result: PlanResult, n_executed: int) -> torch.Tensor | None:
        """Initial mean for the next receding-horizon call, or None when warm start is off.

        The previous mean shifted by the ``n_executed`` actions taken, padded with the midpoint.
        """
        if not self.warm_start:
            return None
        fill = self.midpoint.to(result.mean.device, result.mean.dtype)
        return shift_plan(result.mean, n_executed, fill=fill)

    def _gen(self, device: torch.device, stream: int | None = None) -> torch.Generator:
        """The batch generator (``stream=None``), or episode ``stream``'s own generator, seeded with
        ``derive(seed, "planner-stream", stream)`` and advanced only by that episode's plan calls."""
        if self._generator is not None and stream is None:
            return self._generator
        key = f"{device}" if stream is None else f"{device}/{int(stream)}"
        if key not in self._generators:
            seed = self.seed if stream is None else derive(self.seed, "planner-stream", int(stream))
            self._generators[key] = torch.Generator(device=device).manual_seed(seed)
        return self._generators[key]

    def _noise(self, b: int, device: torch.device, rows: Sequence[torch.Generator] | None = None) -> torch.Tensor:
        """(B, S, H, A) standard-normal noise: white, or colored along H for iCEM. With ``rows`` (one
        generator per row, from :meth:`_gen`) row k is drawn from ``rows[k]`` alone, so it does not
        depend on which other rows share the batch."""
        if rows is not None:
            return torch.cat([self._draw(1, device, g) for g in rows])
        return self._draw(b, device, self._gen(device))

    def _draw(self, b: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
        s, h, a = self.num_samples, self.horizon, self.action_dim
        if self.family != "icem" or self.icem_colored_noise_beta == 0.0 or h == 1:
            return torch.randn(b, s, h, a, generator=g, device=g.device).to(device)
        n_freq = h // 2 + 1
        coeff = torch.randn(b, s, a, n_freq, 2, generator=g, device=g.device).to(device)
        spec = torch.view_as_complex(coeff) * self._noise_amp.to(device)
        series = torch.fft.irfft(spec, n=h, dim=-1) / self._noise_std  # (B, S, A, H)
        return series.transpose(-1, -2).contiguous()

    # ----------------------------------------------------------------------------------------

    def plan(
        self,
        rollout_fn: RolloutFn,
        z0: torch.Tensor,
        z_goal: torch.Tensor,
        init_mean: torch.Tensor | None = None,
        *,
        streams: Sequence[int] | None = None,
        cost_fn: CostFn | None = None,
    ) -> PlanResult:
        """Plan H actions for each of B environments.

        Args:
            rollout_fn: ``rollout_fn(z0_rep, actions) -> latents`` with ``z0_rep`` of shape
                (B·S, *z0.shape[1:]) (environment b's state repeated S times, rows b·S..b·S+S−1),
                ``actions`` (B·S, H, A), returning predicted latents z_1..z_H of shape (B·S, H, d).
                Called exactly ``iterations`` times per plan.
            z0: (B, d) current latent, or (B, W, d) a latent history, per environment.
            z_goal: (B, d) goal latent per environment.
            init_mean: optional (B, H', A) initial mean with H' <= H (e.g. from
                :meth:`next_init`); missing steps are filled with the bounds' midpoint.
            streams: optional B integer keys (the closed loop passes episode indices): row b's
                sampling noise then comes from stream ``streams[b]`` alone, so an episode's plan
                does not depend on how many episodes share the batch or which. Without it the
                whole batch draws from one stream (the result then depends on B).
            cost_fn: optional :data:`CostFn` replacing the L1 energy (e.g. a learned
                reachability head, lensemble.model.reachability); it must score every row
                independently of the others, or batching would change plans.

        Returns:
            :class:`PlanResult`; ``actions`` are within [action_low, action_high].

        Candidates are float32 on ``z0.device``; the cost is computed in float32 whatever the
        dtype of the predicted latents.
        """
        # inference_mode (not just no_grad) skips autograd's version bookkeeping: ~20 % faster
        # on small CPU models. Results are cloned outside it so callers get ordinary tensors.
        with torch.inference_mode():
            res = self._plan(rollout_fn, z0, z_goal, init_mean, streams, cost_fn)
        return PlanResult(
            actions=res.actions.clone(),
            cost=res.cost.clone(),
            mean=res.mean.clone(),
            std=res.std.clone(),
            cost_history=res.cost_history.clone(),
            family=res.family,
            evaluations=res.evaluations,
        )

    def _plan(self, rollout_fn, z0, z_goal, init_mean, streams=None, cost_fn=None) -> PlanResult:
        if z0.ndim < 2:
            raise EvaluationError(f"z0 must be (B, d) or (B, W, d), got shape {tuple(z0.shape)}")
        b = z0.shape[0]
        if z_goal.ndim != 2 or z_goal.shape[0] != b:
            raise EvaluationError(f"z_goal must be (B={b}, d), got shape {tuple(z_goal.shape)}")
        device = z0.device
        s, h, a, k = self.num_samples, self.horizon, self.action_dim, self.topk
        low = self.action_low.to(device)
        high = self.action_high.to(device)

        mean = self.midpoint.to(device).expand(b, h, a).clone()
        if init_mean is not None:
            if init_mean.ndim != 3 or init_mean.shape[0] != b or init_mean.shape[2] != a:
                raise EvaluationError(
                    f"init_mean must be (B={b}, H'<={h}, A={a}), got {tuple(init_mean.shape)}"
                )
            given = min(h, init_mean.shape[1])
            mean[:, :given] = init_mean[:, :given].to(device, torch.float32)
        mean = mean.clamp(low, high)
        std = torch.full((b, h, a), self.init_std, device=device)

        row_gens = None  # one generator per episode, looked up once per plan call, not per iteration
        if streams is not None:
            if len(streams) != b:
                raise EvaluationError(f"{len(streams)} planner streams for {b} environments")
            row_gens = [self._gen(device, k) for k in streams]
        z0_rep = z0.unsqueeze(1).expand(b, s, *z0.shape[1:]).reshape(b * s, *z0.shape[1:])
        rows = torch.arange(b, device=device)
        best_cost = torch.full((b,), math.inf, device=device)
        best_actions = mean.clone()
        history = []
        elites = None
        n_keep = self.icem_keep_elites if self.family == "icem" else 0

        for _ in range(self.iterations):
            cand = mean.unsqueeze(1) + std.unsqueeze(1) * self._noise(b, device, row_gens)
            cand[:, 0] = mean  # always re-evaluate the current mean
            if n_keep and elites is not None:
                cand[:, s - n_keep :] = elites[:, :n_keep]  # elites come sorted, best first
            cand = torch.maximum(torch.minimum(cand, high), low)

            pred = rollout_fn(z0_rep, cand.reshape(b * s, h, a))
            if pred.ndim != 3 or pred.shape[0] != b * s or pred.shape[1] != h:
                raise EvaluationError(
                    f"rollout_fn must return (B*S={b * s}, H={h}, d) latents, got {tuple(pred.shape)}"
                )
            if cost_fn is None:
                cost = latent_l1_cost(
                    pred.reshape(b, s, h, -1), z_goal.unsqueeze(1), over_horizon=self.cost_over_horizon
                )
            else:
                cost = cost_fn(pred.reshape(b, s, h, -1), z_goal.unsqueeze(1)).float()
                if cost.shape != (b, s):
                    raise EvaluationError(f"cost_fn must return (B={b}, S={s}) costs, got {tuple(cost.shape)}")
            if not torch.isfinite(cost).all():
                raise EvaluationError(
                    "the world model returned non-finite latents during planning",
                    remediation="Check the checkpoint for divergence (NaN/inf weights or latents).",
                )

            it_cost, it_idx = cost.min(dim=1)
            improved = it_cost < best_cost
            best_cost = torch.where(improved, it_cost, best_cost)
            best_actions = torch.where(improved[:, None, None], cand[rows, it_idx], best_actions)
            history.append(best_cost.clone())

            if self.family == "mppi":
                # Subtracting the minimum only stabilises the exponentials; weights are unchanged.
                w = torch.softmax(-(cost - it_cost[:, None]) / self.mppi_temperature, dim=1)
                mean = (w[:, :, None, None] * cand).sum(1)
                continue
            _, top = torch.topk(cost, k, dim=1, largest=False, sorted=True)
            elites = cand[rows[:, None], top]  # (B, K, H, A), cheapest first
            # Population std (correction=0) so topk=1 gives 0, not nan.
            e_mean, e_std = elites.mean(1), elites.std(1, correction=0)
            if self.family == "icem":
                m = self.icem_momentum
                mean, std = m * mean + (1 - m) * e_mean, m * std + (1 - m) * e_std
            else:
                mean, std = e_mean, e_std

        return PlanResult(
            actions=best_actions,
            cost=best_cost,
            mean=mean.clamp(low, high),
            std=std,
            cost_history=torch.stack(history),
            family=self.family,
            evaluations=self.iterations * s,
        )

    def __repr__(self) -> str:
        return (
            f"Planner({self.family!r}, horizon={self.horizon}, num_samples={self.num_samples}, "
            f"iterations={self.iterations}, topk={self.topk}, action_dim={self.action_dim})"
        )


# ------------------------------------------------------------------------------------- [device]
def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (CPU for a module without any)."""
    return next((p.device for p in module.parameters()), torch.device("cpu"))


class WorldModelOnDevice:
    """``with WorldModelOnDevice(model, "cuda"):`` the world model's weights on the device, its
    encoder taking CPU frames (a forward pre-hook moves them); on exit everything is back on the
    CPU. The planner follows its inputs' device (candidates, noise and cost on ``z0.device``), so
    closed-loop planning runs where the model is. On ``"cpu"`` it does nothing at all.

    ``precision="bf16"`` also runs everything inside the block under bf16 autocast on the device
    (``eval.precision``; :mod:`lensemble.model.precision`): the weights stay fp32, the encoder's and
    predictor's matrix products run in bf16, the planner's cost in fp32. It is resolved on entry
    (fp32 with a warning on a device without bf16 matrix units); :attr:`precision` then says what
    ran. Exiting twice is harmless (``evaluate`` leaves the block before its fp32 ladder)."""

    def __init__(self, model: torch.nn.Module, device: str | torch.device = "cpu", precision: str = "fp32"):
        self.model, self.device = model, torch.device(device)
        self.requested = precision
        self.precision: str | None = None  # resolved on entry
        self._hook = None
        self._autocast = None

    def __enter__(self):
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"eval.device={self.device} but torch {torch.__version__} sees no CUDA device here",
                              remediation="eval.device=cpu")
        if self.device.type != "cpu":
            self.model.to(self.device)
            device = self.device
            self._hook = self.model.encoder.register_forward_pre_hook(
                lambda module, args: tuple(a.to(device) if torch.is_tensor(a) else a for a in args))
        self.precision = resolve_precision(self.requested, self.device, field="eval.precision")  # [precision]
        if self.precision != "fp32":
            self._autocast = autocast(self.precision, self.device)
            self._autocast.__enter__()
        return self.model

    def __exit__(self, *exc):
        if self._autocast is not None:
            self._autocast.__exit__(None, None, None)
            self._autocast = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
            self.model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return False


__all__ = ["Planner", "CostFn", "latent_l1_cost", "shift_plan", "module_device", "WorldModelOnDevice"]
