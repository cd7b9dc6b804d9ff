"""Function-space distillation toward the aligned consensus (ladder rung 5, server side).

Averaging weights of encoders whose frames differ mixes incompatible bases; averaging their
OUTPUTS after aligning each to a common reference frame does not. The server therefore (1) aligns
every participant's public-probe embeddings to the reference frame with Procrustes and averages
them, then (2) trains a copy of the global encoder for a few AdamW steps to reproduce that
consensus on the probe. Only public probe frames and their embeddings are used.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from lensemble.config.seeds import torch_generator
from lensemble.errors import ConfigError, GaugeError
from lensemble.gauge.procrustes import as_float64_matrix, polar_factors

__all__ = ["aligned_consensus", "distill_encoder", "DistillResult"]


def aligned_consensus(
    embeddings: Mapping[str, torch.Tensor], reference: torch.Tensor, *, singular_floor: float = 1e-6
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean of the participants' probe embeddings, each rotated into the reference frame.

    Args:
        embeddings: participant id -> (n, d) embeddings of the public probe.
        reference: (n, d) embeddings of the same frames in the reference frame (warm start or
            global model).
        singular_floor: relative Procrustes floor.

    Returns:
        (consensus, fit): consensus (n, d) in ``reference``'s dtype and device, the mean over ids
        (sorted order, float64 accumulation) of E_c Q_c; fit maps id -> relative Procrustes
        residual ||E_c Q_c - R||_F / ||R||_F.
    """
    if not embeddings:
        raise GaugeError("aligned_consensus needs at least one participant's embeddings")
    ref = as_float64_matrix(reference, "reference")
    ids = sorted(embeddings)
    stacked = torch.stack(
        [as_float64_matrix(embeddings[k], f"embeddings[{k!r}]").to(ref.device) for k in ids]
    )
    if stacked.shape[1:] != ref.shape:
        raise GaugeError(f"embeddings have shape {tuple(stacked.shape[1:])}, reference {tuple(ref.shape)}")
    q, _ = polar_factors(
        stacked.mT @ ref, singular_floor=singular_floor, labels=[f"{k}|reference" for k in ids]
    )
    aligned = stacked @ q  # (C, n, d)
    ref_norm = torch.linalg.matrix_norm(ref).clamp_min(torch.finfo(torch.float64).tiny)
    fit = (torch.linalg.matrix_norm(aligned - ref) / ref_norm).tolist()
    consensus = aligned.mean(dim=0)
    return consensus.to(dtype=reference.dtype), dict(zip(ids, fit, strict=True))


@dataclass
class DistillResult:
    """What :func:`distill_encoder` returns.

    state_dict: the trained student's parameters and buffers (detached clones).
    loss_before / loss_after: mean over probe frames of ||f(p) - c||² (latent units squared),
        measured in eval mode without gradients before the first and after the last step.
    losses: the training loss of every step (on that step's minibatch).
    """

    state_dict: dict[str, torch.Tensor]
    loss_before: float
    loss_after: float
    steps: int
    losses: list[float] = field(default_factory=list)


def _probe_loss(model: nn.Module, frames: torch.Tensor, target: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for s in range(0, frames.shape[0], batch_size):
            z = model(frames[s : s + batch_size])
            total += float(((z.to(torch.float64) - target[s : s + batch_size]) ** 2).sum())
    return total / frames.shape[0]


def distill_encoder(
    student: nn.Module,
    probe_frames: torch.Tensor,
    consensus: torch.Tensor,
    *,
    steps: int = 50,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    batch_size: int | None = None,
    seed: int = 0,
) -> DistillResult:
    """Train a COPY of ``student`` so that student(probe_frames) ≈ consensus.

    Args:
        student: the encoder to distil (frames (B, ...) -> (B, d)); it is deep-copied, the
            caller's module is left untouched.
        probe_frames: (n, ...) public probe frames, as the encoder takes them.
        consensus: (n, d) targets, e.g. from :func:`aligned_consensus`.
        steps: AdamW steps (gauge.distill_steps).
        lr, weight_decay: AdamW hyper-parameters (gauge.distill_lr).
        batch_size: frames per step; None = the whole probe every step.
        seed: root seed of the minibatch order (stream ``derive(seed, "distill", "batches")``).

    Returns:
        DistillResult with the trained state dict and the before/after probe loss.
    """
    if steps < 1:
        raise ConfigError(f"gauge.distill_steps must be >= 1, got {steps}")
    n = int(probe_frames.shape[0])
    if consensus.ndim != 2 or consensus.shape[0] != n:
        raise GaugeError(f"consensus must be (n={n}, d), got {tuple(consensus.shape)}")
    bs = n if batch_size is None else int(batch_size)
    if not 1 <= bs <= n:
        raise ConfigError(f"distill batch_size must be in [1, {n}], got {batch_size}")

    model = copy.deepcopy(student)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise GaugeError("the student has no trainable parameters")
    device = params[0].device
    frames = probe_frames.to(device)
    target64 = consensus.detach().to(device=device, dtype=torch.float64)
    target = consensus.detach().to(device=device, dtype=params[0].dtype)
    eval_bs = max(bs, 256)

    loss_before = _probe_loss(model, frames, target64, eval_bs)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch_generator(seed, "distill", "batches")
    order = torch.randperm(n, generator=gen)
    cursor = 0
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        if bs == n:
            idx = None
        else:
            if cursor + bs > n:  # new epoch: reshuffle from the same seeded stream
                order, cursor = torch.randperm(n, generator=gen), 0
            idx = order[cursor : cursor + bs].to(device)
            cursor += bs
        x = frames if idx is None else frames[idx]
        y = target if idx is None else target[idx]
        loss = ((model(x) - y) ** 2).sum(dim=-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    loss_after = _probe_loss(model, frames, target64, eval_bs)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return DistillResult(
        state_dict=state, loss_before=loss_before, loss_after=loss_after, steps=steps, losses=losses
    )
