"""Action-conditioned latent predictor g_φ: a small causal transformer over the last W latents.

Token for step t (width = ``predictor_width``)::

    tok_t = in_proj(z_t) + action_encoder(a_t)   [+ pos[j] for the window kind]

then pre-norm transformer blocks with a causal mask, a final LayerNorm (over the width, never over
z), and ``z_{t+1} = z_t + out_proj(h_t)``. z only enters through ``in_proj`` and only leaves
through ``out_proj`` plus the residual, so for any orthogonal Q the substitution
``in_proj.weight -> W Q``, ``out_proj.weight -> Qᵀ W``, ``out_proj.bias -> Qᵀ b`` makes the
predictor map ``z Q`` to ``(g(z)) Q`` exactly (see docs/CONTRACTS.md), for both attention kinds.

Two attention kinds (``ModelConfig.predictor_attention``):

* ``window`` (default): output t depends on the latents and actions at steps max(0, t-W+1)..t
  only, placed at window positions 0.. with learned absolute position embeddings; when T > W,
  :meth:`Predictor.forward` evaluates every sliding window of length W (exact, not approximate).
  A token's hidden state changes when the window slides, so a rollout cannot reuse it.
* ``banded``: every block attends causally to the last W tokens (its own included), with rotary
  position embeddings on queries and keys, so attention depends only on relative offsets. The
  receptive field is ``depth·(W−1)+1`` latents (:attr:`Predictor.context`). A token's keys and
  values never change once computed, so :meth:`Predictor.rollout` keeps them (a KV cache) and
  runs each block on the newest token only, the way sliding-window language models decode.

In both kinds teacher-forced training (:meth:`Predictor.forward`) and recursive planning
(:meth:`Predictor.rollout`) compute the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lensemble.config.schema import ModelConfig
from lensemble.model.inverse_dynamics import InverseDynamicsHead
from lensemble.model.precision import attention  # [precision] SDPA, in fp32 for bf16 inputs on a CPU

_ROPE_BASE = 10000.0


def _rope_tables(pos: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables (T, dim/2) for integer positions ``pos`` (T,) and head width ``dim``."""
    inv = _ROPE_BASE ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)
    ang = pos.to(torch.float64)[:, None] * inv[None]
    return ang.cos().float(), ang.sin().float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate feature pairs (i, i + hd/2) of x (B, heads, T, hd) by position-dependent angles.

    q_m·k_n then depends on m − n only, which is what lets cached keys stay valid."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def _band_mask(t: int, w: int, device=None) -> torch.Tensor:
    """(T, T) boolean mask, True where query i may attend key j: i − W < j ≤ i."""
    i = torch.arange(t, device=device)
    off = i[:, None] - i[None, :]
    return (off >= 0) & (off < w)


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

    def heads_of(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q, k, v, each (B, heads, T, C/heads)."""
        b, t, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def finish(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Residual update from attention output att (B, heads, T', hd) for the last T' rows of x."""
        b, _, t, hd = att.shape
        x = x[:, -t:] + self.proj(att.transpose(1, 2).reshape(b, t, self.heads * hd))
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Window kind: x (B, T, C) -> (B, T, C), or (B, 1, C) for the last position when ``last_only``."""
        q, k, v = self.heads_of(x)
        if last_only:
            # The last query may see every key, so no mask is needed; skipping the other queries
            # (and their MLP) is the saving that matters in the planner's rollout.
            return self.finish(x, attention(q[:, :, -1:], k, v))
        return self.finish(x, attention(q, k, v, is_causal=True))


@dataclass
class RolloutState:
    """What a rollout needs from the observed history, computed once per plan call.

    ``z_last`` (B, d) the current latent; ``hist_tok`` (B, T−1, width) the window kind's tokens of
    the older history latents (with their past actions); ``keys``/``values`` the banded kind's
    per-block cache over those tokens, each (B, heads, ≤W−1, hd) already position-rotated;
    ``next_pos`` the position of the current latent's token.
    """

    z_last: torch.Tensor
    hist_tok: torch.Tensor | None = None
    keys: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None
    next_pos: int = 0

    @property
    def batch(self) -> int:
        return self.z_last.shape[0]


class Predictor(nn.Module):
    """Causal latent dynamics ``z_{t+1} = z_t + out_proj(h_t)`` conditioned on action blocks.

    Sizes come from :class:`ModelConfig`: d = ``latent_dim``, width = ``predictor_width``,
    W = ``history``, action input = ``action_dim * action_block`` (b env actions concatenated),
    attention kind = ``predictor_attention`` (module docstring).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, width = cfg.latent_dim, cfg.predictor_width
        self.latent_dim = d
        self.history = cfg.history
        self.attention = cfg.predictor_attention
        self.action_in = cfg.action_dim * cfg.action_block
        self.in_proj = nn.Linear(d, width)
        self.action_encoder = nn.Sequential(
            nn.Linear(self.action_in, cfg.action_embed_dim),
            nn.GELU(),
            nn.Linear(cfg.action_embed_dim, width),
        )
        if self.attention == "window":
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.history, width))
        self.blocks = nn.ModuleList(
            _Block(width, cfg.predictor_heads) for _ in range(cfg.predictor_depth)
        )
        self.norm = nn.LayerNorm(width)
        self.out_proj = nn.Linear(width, d)
        self._init_weights()
        # Built after every other parameter is initialised, so its RNG draws come last and a model
        # with the head starts exactly like one without it: the lever changes nothing else.
        self.inverse = None
        if cfg.inverse_head > 0:
            self.inverse = InverseDynamicsHead(width, cfg.inverse_head, self.action_in)
            self._init_linears(self.inverse)

    @property
    def context(self) -> int:
        """Latents an output can depend on: W for the window kind, depth·(W−1)+1 for banded."""
        if self.attention == "banded":
            return len(self.blocks) * (self.history - 1) + 1
        return self.history

    @staticmethod
    def _init_linears(module: nn.Module) -> None:
        # Small truncated-normal init (ViT convention) keeps the initial residual update small,
        # i.e. the untrained predictor starts close to the copy baseline z_{t+1} ≈ z_t.
        for m in module.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def _init_weights(self) -> None:
        self._init_linears(self)
        if self.attention == "window":
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    # -- internals --------------------------------------------------------------------------
    def _check(self, z: torch.Tensor, a: torch.Tensor) -> None:
        if z.ndim != 3 or z.shape[-1] != self.latent_dim:
            raise ValueError(f"z must be (B, T, {self.latent_dim}), got {tuple(z.shape)}")
        if a.ndim != 3 or a.shape[-1] != self.action_in:
            raise ValueError(f"actions must be (B, T, {self.action_in}), got {tuple(a.shape)}")

    def _trunk(self, tok: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Window kind: tokens (B, T<=W, width) -> residual updates (B, T, d), or (B, 1, d)."""
        x = tok + self.pos_embed[:, : tok.shape[1]]
        for i, blk in enumerate(self.blocks):
            x = blk(x, last_only=last_only and i == len(self.blocks) - 1)
        return self.out_proj(self.norm(x))

    def _banded(self, tok: torch.Tensor) -> tuple[torch.Tensor, list, list]:
        """Banded kind over a whole sequence: tokens (B, T, width) at positions 0..T−1.

        Returns the final hidden states (B, T, width) and each block's rotated keys and values
        (B, heads, T, hd)."""
        t = tok.shape[1]
        hd = tok.shape[-1] // self.blocks[0].heads
        cos, sin = _rope_tables(torch.arange(t, device=tok.device), hd)
        mask = _band_mask(t, self.history, tok.device)
        x, keys, values = tok, [], []
        for blk in self.blocks:
            q, k, v = blk.heads_of(x)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            x = blk.finish(x, attention(q, k, v, attn_mask=mask))
            keys.append(k)
            values.append(v)
        return x, keys, values

    # -- public API -------------------------------------------------------------------------
    def forward(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Teacher-forced one-step prediction.

        z: (B, T, d) latents; a: (B, T, A*b) action blocks, a[:, t] taken between z_t and z_{t+1}.
        Returns (B, T, d) where output t is the prediction of z_{t+1}. Window kind, T > W: output t
        uses the window of the last W steps ending at t (exactly what :meth:`rollout` does).
        """
        self._check(z, a)
        if a.shape[:2] != z.shape[:2]:
            raise ValueError(f"z {tuple(z.shape)} and actions {tuple(a.shape)} disagree on (B, T)")
        b, t, _ = z.shape
        w = self.history
        tok = self.in_proj(z) + self.action_encoder(a.to(z.dtype))
        if self.attention == "banded":
            return z + self.out_proj(self.norm(self._banded(tok)[0]))
        if t <= w:
            return z + self._trunk(tok)
        first = self._trunk(tok[:, :w])  # outputs 0..W-1 from the first window
        # Windows starting at 1..T-W; only their last output is new.
        win = tok.unfold(1, w, 1)[:, 1:]  # (B, T-W, width, W)
        win = win.permute(0, 1, 3, 2).reshape(b * (t - w), w, tok.shape[-1])
        rest = self._trunk(win, last_only=True).reshape(b, t - w, -1)
        return z + torch.cat([first, rest], dim=1)

    def infer_actions(self, z: torch.Tensor) -> torch.Tensor:
        """Inverse dynamics on latent trajectories: z (..., T, d) -> estimated action blocks
        (..., T−1, A*b), entry t for the step from z_t to z_{t+1}.

        Needs the head (``ModelConfig.inverse_head > 0``). ``in_proj`` runs once per latent (each
        inner latent is the end of one step and the start of the next). z enters only through
        ``in_proj``, so the estimate is unchanged by
        :func:`~lensemble.model.world_model.rotate_latent_basis_`."""
        if self.inverse is None:
            raise ValueError("this predictor has no inverse-dynamics head (model.inverse_head = 0)")
        if z.ndim < 2 or z.shape[-2] < 2 or z.shape[-1] != self.latent_dim:
            raise ValueError(f"z must be (..., T >= 2, {self.latent_dim}), got {tuple(z.shape)}")
        h = self.in_proj(z)
        return self.inverse(h[..., :-1, :], h[..., 1:, :])

    def prepare(self, z_hist: torch.Tensor, past_actions: torch.Tensor | None = None) -> RolloutState:
        """Digest an observed history once, for any number of :meth:`rollout_from` calls.

        z_hist: (B, T0, d) observed latents, oldest first (only the last :attr:`context` are
        used). past_actions: (B, T0−1, A*b), the actions taken between them; required when
        T0 > 1 (the model was trained with them, so guessing would be wrong). Everything that
        does not depend on the future actions is computed here: for the banded kind, every
        block's keys and values over the older history tokens.
        """
        if z_hist.ndim != 3 or z_hist.shape[-1] != self.latent_dim:
            raise ValueError(f"z_hist must be (B, T0, {self.latent_dim}), got {tuple(z_hist.shape)}")
        t0 = z_hist.shape[1]
        if t0 < 1:
            raise ValueError("a rollout needs at least one history latent")
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
            if past_actions.shape[0] != z_hist.shape[0]:
                if past_actions.shape[0] != 1:
                    raise ValueError(
                        f"past_actions batch {past_actions.shape[0]} does not match z_hist batch {z_hist.shape[0]}"
                    )
                past_actions = past_actions.expand(z_hist.shape[0], -1, -1)
        keep = min(t0, self.context) - 1  # older latents that can still reach an output
        state = RolloutState(z_last=z_hist[:, -1])
        if keep == 0:
            return state
        older = z_hist[:, t0 - 1 - keep : t0 - 1]
        tok = self.in_proj(older) + self.action_encoder(past_actions[:, t0 - 1 - keep :].to(z_hist.dtype))
        if self.attention == "window":
            state.hist_tok = tok
            return state
        _, keys, values = self._banded(tok)
        keep_kv = self.history - 1  # keys the next query can still see
        state.keys = [k[:, :, k.shape[2] - keep_kv :] for k in keys]
        state.values = [v[:, :, v.shape[2] - keep_kv :] for v in values]
        state.next_pos = keep
        return state

    def rollout_from(self, state: RolloutState, actions: torch.Tensor) -> torch.Tensor:
        """Recursive open-loop prediction of H future latents from a :meth:`prepare`d history.

        actions: (B·R, H, A*b) for a state of batch B: rows b·R .. b·R+R−1 continue history row b
        (R = 1 for one rollout per history; the planner's R is its number of samples).
        actions[:, 0] is applied at the current latent. Returns (B·R, H, d): ẑ_{T0}, ..., ẑ_{T0+H−1}.

        Cost per step: window kind, a pass of the first blocks over ≤ W tokens and of the last
        block over the newest one; banded kind, one token per block against the cached keys.
        """
        if actions.ndim != 3 or actions.shape[-1] != self.action_in:
            raise ValueError(f"actions must be (B, H, {self.action_in}), got {tuple(actions.shape)}")
        n, horizon = actions.shape[0], actions.shape[1]
        if horizon < 1:
            raise ValueError("rollout needs at least one action")
        if n % state.batch:
            raise ValueError(f"actions batch {n} is not a multiple of the history batch {state.batch}")
        reps = n // state.batch

        def rows(t: torch.Tensor) -> torch.Tensor:  # history row b -> rows b·R..b·R+R−1
            return t if reps == 1 else t.repeat_interleave(reps, dim=0)

        z_cur = rows(state.z_last)
        actions = actions.to(z_cur.dtype)
        act_tok = self.action_encoder(actions)  # (N, H, width), all future actions at once
        new = (self.in_proj(z_cur) + act_tok[:, 0]).unsqueeze(1)
        outs = []
        if self.attention == "banded":
            depth = len(self.blocks)
            keys = [rows(k) for k in state.keys] if state.keys is not None else [None] * depth
            values = [rows(v) for v in state.values] if state.values is not None else [None] * depth
            keep = self.history - 1  # keys a later query can still see
            hd = new.shape[-1] // self.blocks[0].heads
            cos, sin = _rope_tables(
                torch.arange(state.next_pos, state.next_pos + horizon, device=new.device), hd
            )
            for h in range(horizon):
                x = new
                for i, blk in enumerate(self.blocks):
                    q, k, v = blk.heads_of(x)
                    q, k = _rope(q, cos[h : h + 1], sin[h : h + 1]), _rope(k, cos[h : h + 1], sin[h : h + 1])
                    if keys[i] is not None:
                        k, v = torch.cat([keys[i], k], dim=2), torch.cat([values[i], v], dim=2)
                    # Every cached key is inside the band of the newest query: no mask.
                    x = blk.finish(x, attention(q, k, v))
                    if h + 1 < horizon:
                        keys[i], values[i] = k[:, :, k.shape[2] - keep :], v[:, :, v.shape[2] - keep :]
                z_cur = z_cur + self.out_proj(self.norm(x))[:, 0]
                outs.append(z_cur)
                if h + 1 < horizon:
                    new = (self.in_proj(z_cur) + act_tok[:, h + 1]).unsqueeze(1)
            return torch.stack(outs, dim=1)
        tokens = new if state.hist_tok is None else torch.cat([rows(state.hist_tok), new], dim=1)
        for h in range(horizon):
            z_cur = z_cur + self._trunk(tokens, last_only=True)[:, 0]
            outs.append(z_cur)
            if h + 1 < horizon:
                new = (self.in_proj(z_cur) + act_tok[:, h + 1]).unsqueeze(1)
                start = max(0, tokens.shape[1] - (self.history - 1))  # keep the newest W-1
                tokens = torch.cat([tokens[:, start:], new], dim=1)
        return torch.stack(outs, dim=1)

    def rollout(
        self,
        z_hist: torch.Tensor,
        actions: torch.Tensor,
        *,
        past_actions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Recursive open-loop prediction of H future latents.

        z_hist: (B, T0, d) observed latents, oldest first (only the last :attr:`context` are
        used); a batch of 1 is broadcast to the actions' batch. actions: (B, H, A*b),
        actions[:, 0] is applied at the last observed latent. past_actions: (B, T0-1, A*b), the
        actions taken between the history latents; required when T0 > 1. Returns (B, H, d):
        ẑ_{T0}, ..., ẑ_{T0+H-1}. Same as ``rollout_from(prepare(z_hist, past_actions), actions)``.
        """
        if actions.ndim != 3 or actions.shape[-1] != self.action_in:
            raise ValueError(f"actions must be (B, H, {self.action_in}), got {tuple(actions.shape)}")
        if z_hist.ndim != 3 or z_hist.shape[-1] != self.latent_dim:
            raise ValueError(f"z_hist must be (B, T0, {self.latent_dim}), got {tuple(z_hist.shape)}")
        bsz = actions.shape[0]
        if z_hist.shape[0] not in (1, bsz):
            raise ValueError(f"z_hist batch {z_hist.shape[0]} does not match actions batch {bsz}")
        if past_actions is not None and past_actions.ndim == 3:
            if past_actions.shape[0] not in (1, bsz):
                raise ValueError(f"past_actions batch {past_actions.shape[0]} does not match actions batch {bsz}")
            if z_hist.shape[0] == 1 and past_actions.shape[0] == bsz > 1:
                z_hist = z_hist.expand(bsz, -1, -1)  # one history, per-row past actions
        return self.rollout_from(self.prepare(z_hist, past_actions), actions)

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


def reference_rollout(
    pred: Predictor, z_hist: torch.Tensor, actions: torch.Tensor, past_actions: torch.Tensor | None = None
) -> torch.Tensor:
    """The rollout by definition: re-run the teacher-forced forward over the last ``context``
    latents at every step and keep its last output (how stable-worldmodel's reference models roll
    out). Shapes as :meth:`Predictor.rollout` (batches must match). No state is kept between steps, so
    it is slow; benchmarks time :meth:`Predictor.rollout_from` against it."""
    zs = list(z_hist.unbind(1))
    acts = ([] if past_actions is None else list(past_actions.unbind(1))) + list(actions.unbind(1))
    outs = []
    for _ in range(actions.shape[1]):
        lo = max(0, len(zs) - pred.context)
        nxt = pred(torch.stack(zs[lo:], 1), torch.stack(acts[lo : len(zs)], 1))[:, -1]
        outs.append(nxt)
        zs.append(nxt)
    return torch.stack(outs, 1)
