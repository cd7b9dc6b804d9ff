"""Procrustes backstop: align a participant's full weights to a reference frame (ladder rung 3).

Rotating the latent frame by Q (row convention z' = z Q) is an exact reparametrisation of the
world model, because z is produced only by ``encoder.frame`` and read only by the predictor's
``in_proj`` / ``out_proj`` (docs/CONTRACTS.md). For ``nn.Linear`` (y = x Wᵀ + b):

    encoder.frame.weight       (d, d)      W -> Qᵀ W    so the encoder emits z Q
    predictor.in_proj.weight   (width, d)  W -> W Q     so (z Q)(W Q)ᵀ = z Wᵀ: hidden state unchanged
    predictor.out_proj.weight  (d, width)  W -> Qᵀ W    so the prediction comes out as ẑ Q
    predictor.out_proj.bias    (d,)        b -> Qᵀ b

A residual z_t + out stays consistent since both terms rotate. The map is affine in the weights,
so it must be applied to the FULL local weights and then re-differenced against the global ones
(Δ' = rotate(W_global + Δ) - W_global); rotating Δ alone would be wrong.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lensemble.errors import DegenerateProcrustes, GaugeError
from lensemble.gauge.procrustes import procrustes_align

__all__ = [
    "FRAME_WEIGHT",
    "IN_PROJ_WEIGHT",
    "OUT_PROJ_WEIGHT",
    "OUT_PROJ_BIAS",
    "rotate_state_dict",
    "align_and_redifference",
    "backstop_metrics",
]

FRAME_WEIGHT = "encoder.frame.weight"
IN_PROJ_WEIGHT = "predictor.in_proj.weight"
OUT_PROJ_WEIGHT = "predictor.out_proj.weight"
OUT_PROJ_BIAS = "predictor.out_proj.bias"

# An orthogonal Q from procrustes_align satisfies QᵀQ = I to ~1e-14; anything worse than this is
# not a rotation and would silently change the function instead of reparametrising it.
_ORTHO_TOL = 1e-6


def _check_orthogonal(q: torch.Tensor, d: int) -> torch.Tensor:
    if not isinstance(q, torch.Tensor) or q.shape != (d, d):
        raise GaugeError(f"Q must be a ({d}, {d}) tensor, got {getattr(q, 'shape', type(q).__name__)}")
    q64 = q.detach().to(torch.float64)
    err = float((q64.mT @ q64 - torch.eye(d, dtype=torch.float64, device=q64.device)).abs().max())
    if not err < _ORTHO_TOL:
        raise GaugeError(f"Q is not orthogonal (max |QᵀQ - I| = {err:.2e}); refusing to rotate the weights")
    return q64


def rotate_state_dict(
    state_dict: Mapping[str, torch.Tensor], q: torch.Tensor, *, prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Rotate a world model's latent frame by Q: the returned model computes z Q wherever the
    input model computed z.

    Args:
        state_dict: the full world-model state dict (keys per CONTRACTS.md, optionally under
            ``prefix``).
        q: (d, d) orthogonal matrix, row convention z' = z Q (e.g. from procrustes_align).
        prefix: prepended to the four key names (e.g. ``"model."``).

    Returns:
        A new dict with the same keys in the same order. The four frame-carrying tensors are new
        tensors (computed in float64, stored in their original dtype and device); every other
        entry is the very same tensor object as in the input (not copied, byte-identical).

    Raises:
        GaugeError: a required key is missing, shapes disagree with Q, or Q is not orthogonal.
    """
    names = {"frame": prefix + FRAME_WEIGHT, "in": prefix + IN_PROJ_WEIGHT, "out": prefix + OUT_PROJ_WEIGHT}
    missing = [k for k in names.values() if k not in state_dict]
    if missing:
        raise GaugeError(
            f"backstop needs {missing} in the state dict: the frame layer and the predictor's "
            "in/out projections are what an exact rotation acts on",
            remediation="Use a world model built by lensemble.model (see docs/CONTRACTS.md).",
        )
    frame = state_dict[names["frame"]]
    d = int(frame.shape[0])
    q64 = _check_orthogonal(q, d)
    bias_key = prefix + OUT_PROJ_BIAS
    w_in, w_out = state_dict[names["in"]], state_dict[names["out"]]
    if (
        frame.shape != (d, d)
        or w_in.ndim != 2
        or w_in.shape[1] != d
        or w_out.ndim != 2
        or w_out.shape[0] != d
    ):
        raise GaugeError(
            f"shape mismatch for latent dim {d}: {names['frame']} {tuple(frame.shape)}, "
            f"{names['in']} {tuple(w_in.shape)} (expected (width, {d})), "
            f"{names['out']} {tuple(w_out.shape)} (expected ({d}, width))"
        )
    if bias_key in state_dict and tuple(state_dict[bias_key].shape) != (d,):
        raise GaugeError(f"{bias_key} has shape {tuple(state_dict[bias_key].shape)}, expected ({d},)")

    def _apply(t: torch.Tensor, fn) -> torch.Tensor:
        qd = q64.to(t.device)
        return fn(t.detach().to(torch.float64), qd).to(dtype=t.dtype)

    rotated = {
        names["frame"]: _apply(frame, lambda w, qd: qd.mT @ w),
        names["in"]: _apply(w_in, lambda w, qd: w @ qd),
        names["out"]: _apply(w_out, lambda w, qd: qd.mT @ w),
    }
    if bias_key in state_dict:
        rotated[bias_key] = _apply(state_dict[bias_key], lambda b, qd: qd.mT @ b)
    return {k: rotated.get(k, v) for k, v in state_dict.items()}


def align_and_redifference(
    local_sd: Mapping[str, torch.Tensor],
    global_sd: Mapping[str, torch.Tensor],
    probe_embeddings_local: torch.Tensor,
    reference_embeddings: torch.Tensor,
    *,
    singular_floor: float = 1e-6,
    prefix: str = "",
    fit_idx: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, float]:
    """Participant-side backstop: align the full local weights, then re-difference.

    Args:
        local_sd: full local state dict after the inner steps (W_global + Δ).
        global_sd: the global state dict this round started from (same keys).
        probe_embeddings_local: (n, d) the LOCAL model's embeddings of the public probe.
        reference_embeddings: (n, d) the reference frame's embeddings of the same frames
            (the warm start f_ref or the global model).
        singular_floor: relative floor passed to procrustes_align.
        prefix: key prefix, see rotate_state_dict.
        fit_idx: rows of the two embedding matrices the rotation is fitted on (the probe's
            landmark frames, so that drift measured on the other frames stays held out); None:
            all rows.

    Returns:
        (delta, Q, residual): delta maps every floating-point key to rotate(local) - global in
        the key's dtype (non-floating entries such as counters are not pseudo-gradients and are
        omitted); Q (d, d) float64 maps the local frame onto the reference frame; residual is the
        relative Procrustes fit error (see procrustes_align).

    Raises:
        DegenerateProcrustes, GaugeError (key sets differ, shapes differ).
    """
    if set(local_sd) != set(global_sd):
        only_l = sorted(set(local_sd) - set(global_sd))
        only_g = sorted(set(global_sd) - set(local_sd))
        raise GaugeError(
            f"local and global state dicts differ in keys (local only {only_l}, global only {only_g})"
        )
    if fit_idx is not None:
        idx = torch.as_tensor(fit_idx, dtype=torch.long)
        probe_embeddings_local, reference_embeddings = probe_embeddings_local[idx], reference_embeddings[idx]
    q, residual = procrustes_align(
        probe_embeddings_local, reference_embeddings, singular_floor=singular_floor
    )
    aligned = rotate_state_dict(local_sd, q, prefix=prefix)
    delta: dict[str, torch.Tensor] = {}
    for key, w in aligned.items():
        g = global_sd[key]
        if w.shape != g.shape:
            raise GaugeError(f"{key}: local shape {tuple(w.shape)} != global shape {tuple(g.shape)}")
        if w.is_floating_point():
            delta[key] = w.detach() - g.detach().to(device=w.device, dtype=w.dtype)
    return delta, q, residual


def backstop_metrics(
    local_embeddings: torch.Tensor,
    reference_embeddings: torch.Tensor,
    q: torch.Tensor,
    fit_residual: float,
    *,
    measurement_idx: torch.Tensor | None = None,
    singular_floor: float = 1e-6,
) -> dict[str, float]:
    """What the backstop did, as scalars a participant may release (each key says its quantity).

    * ``gauge/backstop_angle_deg`` / ``gauge/backstop_residual``: the geodesic angle / ||Q − I||_F
      of the rotation Q it *removed* (local frame -> reference frame);
      ``gauge/backstop_fit``: the relative Procrustes residual on the frames Q was fitted on.
    * on the held-out ``measurement_idx`` rows (all rows when None), the local embeddings rotated by
      Q against the reference: ``gauge/backstop_aligned_angle_deg`` (the rotation still left),
      ``gauge/backstop_aligned_rel_residual`` (||E Q − R||_F / ||R||_F, no further rotation),
      ``gauge/backstop_aligned_subspace_angle_deg``; and before the rotation,
      ``gauge/backstop_unaligned_rel_residual`` (||E − R||_F / ||R||_F).
    """
    from lensemble.gauge.drift import drift_magnitudes, misalignment

    frob, angle, _ = drift_magnitudes(q.to(torch.float64).unsqueeze(0))
    local = local_embeddings.detach().to(torch.float64)
    ref = reference_embeddings.detach().to(torch.float64)
    if measurement_idx is not None:
        idx = torch.as_tensor(measurement_idx, dtype=torch.long)
        local, ref = local[idx], ref[idx]
    aligned = local @ q.to(torch.float64).to(local.device)
    ref_norm = float(torch.linalg.matrix_norm(ref)) or 1.0
    out = {
        "gauge/backstop_angle_deg": float(angle[0]),
        "gauge/backstop_residual": float(frob[0]),
        "gauge/backstop_fit": float(fit_residual),
        "gauge/backstop_aligned_rel_residual": float(torch.linalg.matrix_norm(aligned - ref)) / ref_norm,
        "gauge/backstop_unaligned_rel_residual": float(torch.linalg.matrix_norm(local - ref)) / ref_norm,
    }
    try:
        left = misalignment(aligned, ref, singular_floor=singular_floor)
    except DegenerateProcrustes:
        # Too few or collapsed held-out frames to identify what rotation is left: say so, and
        # never let a diagnostic change what the backstop did.
        out["gauge/backstop_aligned_degenerate"] = 1.0
        return out
    out.update({"gauge/backstop_aligned_angle_deg": left.angle_deg,
                "gauge/backstop_aligned_subspace_angle_deg": left.subspace_angle_deg,
                "gauge/backstop_aligned_degenerate": 0.0})
    return out
