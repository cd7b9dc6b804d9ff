"""Action-conditioned latent predictor g_φ: a small causal transformer over the last W latents.

Token for step t (width = ``predictor_width``)::

    tok_t = in_proj(z_t) + action_encoder(a_t) + pos[j]      (j = position of t inside its window)

then pre-norm transformer blocks with a causal mask, a final LayerNorm (over the width, never over
z), and ``z_{t+1} = z_t + out_proj(h_t)``. z only enters through ``in_proj`` and only leaves
through ``out_proj`` plus the residual, so for any orthogonal Q the substitution
``in_proj.weight -> W Q``, ``out_proj.weight -> Qᵀ W``, ``out_proj.bias -> Qᵀ b`` makes the
predictor map ``z Q`` to ``(g(z)) Q`` exactly (see docs/CONTRACTS.md).

Window semantics (W = ``history``): output t depends on the latents and actions at steps
max(0, t-W+1)..t only, placed at window positions 0..; this is what :meth:`Predictor.rollout`
sees while it slides, so teacher-forced training and recursive planning agree. When T > W,
:meth:`Predictor.forward` evaluates every sliding window of length W (exact, not approximate).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lensemble.config.schema import ModelConfig


class _Block(nn.Module):
    """Pre-norm transformer block (causal self-attention + 4x GELU MLP) on (B, T, width)."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )

    def forward(self, x: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C), or (B, 1, C) for the last position when ``last_only``."""
        b, t, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, T, hd)
        if last_only:
            # The last query may see every key, so no mask is needed; skipping the other queries
            # (and their MLP) is the saving that matters in the planner's rollout.
            att = F.scaled_dot_product_attention(q[:, :, -1:], k, v)
            x = x[:, -1:] + self.proj(att.transpose(1, 2).reshape(b, 1, c))
        else:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class Predictor(nn.Module):
    """Causal latent dynamics ``z_{t+1} = z_t + out_proj(h_t)`` conditioned on action blocks.

    Sizes come from :class:`ModelConfig`: d = ``latent_dim``, width = ``predictor_width``,
    W = ``history``, action input = ``action_dim * action_block`` (b env actions concatenated).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, width = cfg.latent_dim, cfg.predictor_width
        self.latent_dim = d
        self.history = cfg.history
        self.action_in = cfg.action_dim * cfg.action_block
        self.in_proj = nn.Linear(d, width)
        self.action_encoder = nn.Sequential(
            nn.Linear(self.action_in, cfg.action_embed_dim),
            nn.GELU(),
            nn.Linear(cfg.action_embed_dim, width),
        )
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.history, width))
        self.blocks = nn.ModuleList(
            _Block(width, cfg.predictor_heads) for _ in range(cfg.predictor_depth)
        )
        self.norm = nn.LayerNorm(width)
        self.out_proj = nn.Linear(width, d)
        self._init_weights()

    def _init_weights(self) -> None:
        # Small truncated-normal init (ViT convention) keeps the initial residual update small,
        # i.e. the untrained predictor starts close to the copy baseline z_{t+1} ≈ z_t.
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    # -- internals --------------------------------------------------------------------------
    def _check(self, z: torch.Tensor, a: torch.Tensor) -> None:
        if z.ndim != 3 or z.shape[-1] != self.latent_dim:
            raise ValueError(f"z must be (B, T, {self.latent_dim}), got {tuple(z.shape)}")
        if a.ndim != 3 or a.shape[-1] != self.action_in:
            raise ValueError(f"actions must be (B, T, {self.action_in}), got {tuple(a.shape)}")

    def _trunk(self, tok: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Tokens (B, T<=W, width) -> residual updates (B, T, d), or (B, 1, d) if last_only."""
        x = tok + self.pos_embed[:, : tok.shape[1]]
        for i, blk in enumerate(self.blocks):
            x = blk(x, last_only=last_only and i == len(self.blocks) - 1)
        return self.out_proj(self.norm(x))

    # -- public API -------------------------------------------------------------------------
    def forward(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Teacher-forced one-step prediction.

        z: (B, T, d) latents; a: (B, T, A*b) action blocks, a[:, t] taken between z_t and z_{t+1}.
        Returns (B, T, d) where output t is the prediction of z_{t+1}. For T > W, output t uses
        the window of the last W steps ending at t (exactly what :meth:`rollout` does).
        """
        self._check(z, a)
        if a.shape[:2] != z.shape[:2]:
            raise ValueError(f"z {tuple(z.shape)} and actions {tuple(a.shape)} disagree on (B, T)")
        b, t, _ = z.shape
        w = self.history
        tok = self.in_proj(z) + self.action_encoder(a.to(z.dtype))
        if t <= w:
            return z + self._trunk(tok)
        first = self._trunk(tok[:, :w])  # outputs 0..W-1 from the first window
        # Windows starting at 1..T-W; only their last output is new.
        win = tok.unfold(1, w, 1)[:, 1:]  # (B, T-W, width, W)
        win = win.permute(0, 1, 3, 2).reshape(b * (t - w), w, tok.shape[-1])
        rest = self._trunk(win, last_only=True).reshape(b, t - w, -1)
        return z + torch.cat([first, rest], dim=1)

    def rollout(
        self,
        z_hist: torch.Tensor,
        actions: torch.Tensor,
        *,
        past_actions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Recursive open-loop prediction of H future latents.

        z_hist: (B, T0, d) observed latents, oldest first (only the last W are used); a batch of 1
        is broadcast to the actions' batch. actions: (B, H, A*b), actions[:, 0] is applied at the
        last observed latent. past_actions: (B, T0-1, A*b), the actions taken between the history
        latents; required when T0 > 1 (the model was trained with them, so guessing would be
        wrong). Returns (B, H, d): ẑ_{T0}, ..., ẑ_{T0+H-1}.

        Cost: H passes over at most W tokens; token embeddings are computed once per latent and
        the last block only evaluates the newest position.
        """
        if z_hist.ndim != 3 or z_hist.shape[-1] != self.latent_dim:
            raise ValueError(f"z_hist must be (B, T0, {self.latent_dim}), got {tuple(z_hist.shape)}")
        if actions.ndim != 3 or actions.shape[-1] != self.action_in:
            raise ValueError(f"actions must be (B, H, {self.action_in}), got {tuple(actions.shape)}")
        bsz, horizon = actions.shape[0], actions.shape[1]
        if z_hist.shape[0] == 1 and bsz > 1:
            z_hist = z_hist.expand(bsz, -1, -1)
        if z_hist.shape[0] != bsz:
            raise ValueError(f"z_hist batch {z_hist.shape[0]} does not match actions batch {bsz}")
        t0 = z_hist.shape[1]
        if t0 < 1 or horizon < 1:
            raise ValueError("rollout needs at least one history latent and one action")
        actions = actions.to(z_hist.dtype)
        act_tok = self.action_encoder(actions)  # (B, H, width), all future actions at once
        hist_tok = self.in_proj(z_hist[:, -self.history :])
        if t0 > 1:
            if past_actions is None:
                raise ValueError(
                    f"z_hist has {t0} latents: pass past_actions (B, {t0 - 1}, {self.action_in}) "
                    "or give only the current latent"
                )
            if past_actions.ndim != 3 or past_actions.shape[1:] != (t0 - 1, self.action_in):
                raise ValueError(
                    f"past_actions must be (B, {t0 - 1}, {self.action_in}), got {tuple(past_actions.shape)}"
                )
            if past_actions.shape[0] == 1 and bsz > 1:
                past_actions = past_actions.expand(bsz, -1, -1)
            keep = min(t0, self.history) - 1
            past_tok = self.action_encoder(past_actions[:, t0 - 1 - keep :].to(z_hist.dtype))
            a_hist = torch.cat([past_tok, act_tok[:, :1]], dim=1)
        else:
            a_hist = act_tok[:, :1]
        tokens = hist_tok + a_hist
        z_cur = z_hist[:, -1]
        outs = []
        for h in range(horizon):
            z_cur = z_cur + self._trunk(tokens, last_only=True)[:, 0]
            outs.append(z_cur)
            if h + 1 < horizon:
                new = (self.in_proj(z_cur) + act_tok[:, h + 1]).unsqueeze(1)
                start = max(0, tokens.shape[1] - (self.history - 1))  # keep the newest W-1
                tokens = torch.cat([tokens[:, start:], new], dim=1)
        return torch.stack(outs, dim=1)

    def rollout_nograd(
        self,
        z_hist: torch.Tensor,
        actions: torch.Tensor,
        *,
        past_actions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`rollout` under ``torch.inference_mode`` for planning (outputs carry no graph and
        cannot later enter autograd)."""
        with torch.inference_mode():
            return self.rollout(z_hist, actions, past_actions=past_actions)
