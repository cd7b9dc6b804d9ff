"""``EvalReport``: the scalar-only record of one evaluation (DESIGN.md §7).

A report leaves the machine that produced it (run folders, papers, dashboards), so it holds plain
numbers and strings only. Two guards enforce that before any field is parsed:

* an array or tensor anywhere in the input raises :class:`ResidencyViolation` (fail-closed): an
  embedding or an observation smuggled into a report would break data residency;
* a NaN or infinite number raises :class:`EvaluationError`: a broken metric must stop the run,
  not print "nan" into a table.

Out-of-range values are errors too, never clamped: a success rate of 1.02 means a bug upstream.
:meth:`EvalReport.write` refuses a destination inside a silo's private folder (``guard_export``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lensemble.data.residency import guard_export
from lensemble.errors import EvaluationError, ResidencyViolation
from lensemble.eval.stats import wilson_interval

# Relative tolerance for the consistency checks between counts and derived rates.
_TOL = 1e-9


def _is_array_like(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    # A tensor cannot exist unless its library is imported, so look only at loaded modules.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return True
    # Other array libraries (jax, tensorflow, cupy, ...) expose __array__ or __dlpack__.
    return hasattr(value, "__dlpack__") or hasattr(value, "__array_interface__")


def _scan(value: Any, path: str) -> Any:
    """Reject arrays/tensors and non-finite numbers anywhere in ``value``; unwrap numpy scalars."""
    if _is_array_like(value) and not isinstance(value, np.generic):
        raise ResidencyViolation(
            f"EvalReport field {path!r} holds a {type(value).__module__}.{type(value).__name__}; "
            "reports carry scalar metrics only"
        )
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise EvaluationError(f"EvalReport field {path!r} is not finite ({value})")
    if isinstance(value, dict):
        return {k: _scan(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scan(v, f"{path}[{i}]") for i, v in enumerate(value))
    return value


class EpisodeRecord(BaseModel):
    """One closed-loop episode, scalars only. Two reports with the same ``goal_spec_hash`` hold the
    same episodes (same ``index`` and ``seed``, same factor values and goal), so their records pair
    one to one (:func:`pair_episodes`).

    Distances are in the env's state units (TwoRoom: 224 px frame pixels); ``steps`` counts env
    actions executed; ``route_valid`` is None where the env has no wall (PushT), else whether every
    step's path crossed the wall only through a door (:mod:`lensemble.eval.routes`);
    ``cross_wall`` is None there too, else whether the task's goal lay in the other room
    (:func:`lensemble.eval.routes.crosses_wall`; None also in records written before it was kept).
    ``seed`` names the task; under the dataset-goal protocol the env itself was reset with
    ``derive(seed, "dataset-goal")`` (:mod:`lensemble.eval.goals`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0)
    seed: int
    success: bool
    steps: int = Field(ge=0)
    start_distance: float = Field(ge=0)
    final_distance: float = Field(ge=0)
    route_valid: bool | None = None
    cross_wall: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _guard_inputs(cls, data: Any) -> Any:
        # The same residency scan as the report's: scalars only, finite.
        return {k: _scan(v, f"episodes[].{k}") for k, v in data.items()} if isinstance(data, dict) else data


class EvalReport(BaseModel):
    """Scalar summary of one closed-loop evaluation plus the evaluation-ladder numbers.

    Units: rates in [0, 1]; ``time_per_action_ms`` in milliseconds of wall time per executed
    action (planning included); latent errors in the latent metric the ladder states (they are not
    interchangeable across rungs). ``planning_samples`` counts candidate action sequences evaluated
    by the model per planning call (num_samples × iterations). ``success_ci`` is the 95 % Wilson
    interval of ``n_successes / n_episodes``; it is computed when not given and checked when given.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Closed-loop MPC success
    success_rate: float
    n_episodes: int = Field(ge=1)
    n_successes: int = Field(ge=0)
    success_ci: tuple[float, float]
    planning_samples: int = Field(ge=1)
    time_per_action_ms: float = Field(ge=0)
    # Provenance
    env_id: str
    held_out_factors: tuple[str, ...] = ()
    goal_spec_hash: str
    goal_source: Literal["expert", "dataset"] = "expert"
    """The goal protocol (``eval.goal_source``): strict ``expert`` goals or ``dataset`` goals."""
    seed: int
    config_hash: str
    checkpoint_hash: str
    planner: str
    # Evaluation ladder (each a separate number; None when not measured)
    one_step_error: float | None = None
    copy_last_error: float | None = None
    train_one_step_error: float | None = None
    """The one-step rung on (up to 40 of) the silos' training episodes, beside its copy-last
    baseline ``train_copy_last_error``: beating copying there but not on held-out episodes means
    the model fitted its training episodes without learning the dynamics (docs/evaluation.md)."""
    train_copy_last_error: float | None = None
    rollout_error: dict[int, float] | None = None
    rollout_composite: float | None = None
    intervention_error: float | None = None
    transfer_success_rate: float | None = None
    probe_r2: float | None = None
    pixel_pca_r2: float | None = None
    """The probe rung's pixel baseline: the same ridge probe on a 64-component PCA of the raw
    pixels (lensemble.eval.ladder.pixel_pca_probe_r2); read beside ``probe_r2``."""
    effective_dim: float | None = None
    latent_std: float | None = None
    # Per-episode outcomes (None in reports written before them) and route validity
    episodes: tuple[EpisodeRecord, ...] | None = None
    route_valid_success_rate: float | None = None
    """Share of episodes that succeeded (the env's own flag) *and* took a valid route; None where
    the env has no wall or the episodes are not recorded. ``success_rate`` stays the env's flag."""
    n_route_valid_successes: int | None = Field(None, ge=0)
    n_cross_wall_tasks: int | None = Field(None, ge=0)
    """Tasks whose goal lay across the wall (TwoRoom); None where the env has no wall or the report
    predates the count. :func:`cross_wall_summary` gives the share and the success on them."""
    n_cross_wall_successes: int | None = Field(None, ge=0)
    planning_cost: dict[str, Any] | None = None
    """The MPC energy (``eval.cost``): ``{"cost": "l1"}`` or the reachability head's fit
    (lensemble.eval.costs.planning_cost); None for the random and oracle controls and older reports."""
    precision: Literal["fp32", "bf16"] | None = None
    """What closed-loop encoding and planning ran in: ``eval.precision`` after the device check (fp32
    where bf16 was requested on a device without bf16 matrix units; ``auto`` resolves to bf16 or
    fp32 by the same check); None for the controls and older reports."""

    @property
    def planner_label(self) -> str:
        """The planner with the precision it ran in, for tables: ``cem (bf16)``; just ``cem`` when
        the precision is not recorded (controls, older reports)."""
        return self.planner if self.precision is None else f"{self.planner} ({self.precision})"

    @model_validator(mode="before")
    @classmethod
    def _guard_inputs(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: _scan(v, k) for k, v in data.items()}
        rate = data.get("success_rate")
        if isinstance(rate, (int, float)) and not 0.0 <= rate <= 1.0:
            raise EvaluationError(f"success_rate must be in [0, 1], got {rate}")
        transfer = data.get("transfer_success_rate")
        if isinstance(transfer, (int, float)) and not 0.0 <= transfer <= 1.0:
            raise EvaluationError(f"transfer_success_rate must be in [0, 1], got {transfer}")
        n, k = data.get("n_episodes"), data.get("n_successes")
        if data.get("success_ci") is None and isinstance(n, int) and isinstance(k, int):
            if 0 <= k <= n and n >= 1:
                data["success_ci"] = wilson_interval(k, n).as_tuple()
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> "EvalReport":
        if self.n_successes > self.n_episodes:
            raise EvaluationError(f"n_successes {self.n_successes} exceeds n_episodes {self.n_episodes}")
        expected = self.n_successes / self.n_episodes
        if abs(self.success_rate - expected) > _TOL:
            raise EvaluationError(f"success_rate {self.success_rate} != n_successes/n_episodes = {expected}")
        wilson = wilson_interval(self.n_successes, self.n_episodes).as_tuple()
        if any(abs(a - b) > _TOL for a, b in zip(self.success_ci, wilson, strict=True)):
            raise EvaluationError(f"success_ci {self.success_ci} is not the 95% Wilson interval {wilson}")
        for name in (
            "one_step_error",
            "copy_last_error",
            "train_one_step_error",
            "train_copy_last_error",
            "rollout_composite",
            "intervention_error",
            "effective_dim",
            "latent_std",
        ):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise EvaluationError(f"{name} must be >= 0, got {value}")
        if self.episodes is not None:
            eps = self.episodes
            if len(eps) != self.n_episodes:
                raise EvaluationError(f"{len(eps)} episode records for n_episodes = {self.n_episodes}")
            if len({e.index for e in eps}) != len(eps):
                raise EvaluationError("episode records repeat an episode index")
            if sum(e.success for e in eps) != self.n_successes:
                raise EvaluationError("the episode records' successes do not add up to n_successes")
        routes = None
        if self.episodes is not None and all(e.route_valid is not None for e in self.episodes):
            routes = sum(e.success and bool(e.route_valid) for e in self.episodes)
        if (self.n_route_valid_successes is None) != (self.route_valid_success_rate is None):
            raise EvaluationError("route_valid_success_rate and n_route_valid_successes come together")
        if self.n_route_valid_successes is not None:
            if routes is not None and self.n_route_valid_successes != routes:
                raise EvaluationError(f"n_route_valid_successes {self.n_route_valid_successes} != {routes} "
                                      "from the episode records")
            if self.n_route_valid_successes > self.n_successes:
                raise EvaluationError("route-valid successes exceed successes")
            if abs(self.route_valid_success_rate - self.n_route_valid_successes / self.n_episodes) > _TOL:
                raise EvaluationError("route_valid_success_rate != n_route_valid_successes / n_episodes")
        self._check_cross_wall()
        if self.rollout_error is not None:
            for horizon, err in self.rollout_error.items():
                if horizon < 1 or err < 0:
                    raise EvaluationError(
                        f"rollout_error needs horizons >= 1 and errors >= 0, got {horizon}: {err}"
                    )
        return self

    def _check_cross_wall(self) -> None:
        tasks, wins = self.n_cross_wall_tasks, self.n_cross_wall_successes
        if (tasks is None) != (wins is None):
            raise EvaluationError("n_cross_wall_tasks and n_cross_wall_successes come together")
        if tasks is None:
            return
        if tasks > self.n_episodes or wins > tasks or wins > self.n_successes:
            raise EvaluationError(f"cross-wall counts {wins}/{tasks} do not fit {self.n_successes}/{self.n_episodes}")
        if self.episodes is not None and all(e.cross_wall is not None for e in self.episodes):
            want = (sum(bool(e.cross_wall) for e in self.episodes),
                    sum(e.success and bool(e.cross_wall) for e in self.episodes))
            if (tasks, wins) != want:
                raise EvaluationError(f"cross-wall counts {wins}/{tasks} != {want[1]}/{want[0]} from the episode records")

    # ----------------------------------------------------------------------------------------

    def to_json(self, *, indent: int | None = 2) -> str:
        """JSON text; ``EvalReport.from_json(r.to_json()) == r``."""
        return self.model_dump_json(indent=indent)

    def write(self, path: str | Path) -> Path:
        """Write :meth:`to_json` and a newline to ``path`` (its folder is created); return the path.

        A report is made to leave the machine, so a destination inside a non-exportable silo
        folder raises :class:`ResidencyViolation` before anything is written.
        """
        path = Path(path)
        guard_export(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_json(cls, text: str | bytes) -> "EvalReport":
        """Parse and re-validate a report written by :meth:`to_json`."""
        return cls.model_validate_json(text)

    def metrics(self) -> dict[str, float]:
        """The stable ``eval/*`` keys for the JSONL metrics sink."""
        out = {
            "eval/success_rate": self.success_rate,
            "eval/planning_samples": float(self.planning_samples),
            "eval/time_per_action_ms": self.time_per_action_ms,
        }
        if self.route_valid_success_rate is not None:
            out["eval/route_valid_success_rate"] = self.route_valid_success_rate
        summary = cross_wall_summary(self)
        if summary is not None:
            out["eval/cross_wall_share"] = summary["share"]
            if summary["success_rate"] is not None:
                out["eval/cross_wall_success_rate"] = summary["success_rate"]
        return out


def cross_wall_summary(report: EvalReport) -> dict | None:
    """The report's tasks split by whether the goal lay across the wall; None where not recorded.

    ``share``: cross-wall tasks / episodes; ``tasks``, ``successes``, ``success_rate`` (None with no
    such task) and ``success_ci`` (95 % Wilson) on them; ``same_room`` the same three for the rest.
    """
    tasks, wins = report.n_cross_wall_tasks, report.n_cross_wall_successes
    if tasks is None:
        return None

    def part(k: int, n: int) -> dict:
        return {"tasks": n, "successes": k, "success_rate": k / n if n else None,
                "success_ci": wilson_interval(k, n).as_tuple() if n else None}

    return {"share": tasks / report.n_episodes, **part(wins, tasks),
            "same_room": part(report.n_successes - wins, report.n_episodes - tasks)}


def pair_episodes(a: EvalReport, b: EvalReport) -> list[tuple[EpisodeRecord, EpisodeRecord]]:
    """The episodes of two reports, paired one to one (sorted by episode index).

    Raises EvaluationError unless both reports were scored on the same tasks (equal
    ``goal_spec_hash``) and both recorded their episodes, with the same (index, seed) pairs.
    """
    if a.goal_spec_hash != b.goal_spec_hash:
        raise EvaluationError("the two reports were scored on different tasks (goal_spec_hash differs): "
                              "their episodes do not pair")
    if a.episodes is None or b.episodes is None:
        raise EvaluationError("a report holds no per-episode records (written before they were kept)")
    ka = {(e.index, e.seed): e for e in a.episodes}
    kb = {(e.index, e.seed): e for e in b.episodes}
    if set(ka) != set(kb):
        raise EvaluationError("the two reports' episode records name different episodes")
    return [(ka[k], kb[k]) for k in sorted(ka)]


__all__ = ["EpisodeRecord", "EvalReport", "cross_wall_summary", "pair_episodes"]
