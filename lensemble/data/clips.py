"""Clip sampling for training: K frames at stride b with the b actions between frames concatenated.

A clip starting at frame t of an episode holds frames t, t+b, ..., t+(K-1)b. The action between
frames t+kb and t+(k+1)b is the concatenation of the b env actions taken in between, in time
order: ``[a_{t+kb}, a_{t+kb+1}, ..., a_{t+kb+b-1}]`` flattened to (b·A,), i.e. element
``j·A + i`` is dimension i of the j-th env action of the block. The predictor consumes exactly
this (one latent step = b env steps = ``model.action_block``).

The sampler is on the training hot path: all episodes are flattened once into contiguous torch
buffers (frames already channel-first) plus a table of valid clip starts, so ``sample`` is a
handful of vectorised gathers with no per-clip Python work. Sampling uses only the passed
``torch.Generator``, so a seeded generator yields the same batches on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from lensemble.errors import ConfigError


@dataclass
class Clips:
    """A batch of clips.

    obs     uint8   (B, K, 3, H, W)
    actions float32 (B, K-1, A·b)
    state   float32 (B, K, S)
    """

    obs: torch.Tensor
    actions: torch.Tensor
    state: torch.Tensor


def _episode_arrays(item) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Split a batch-like item into per-episode (obs (T+1,H,W,3), actions (T,A), state (T+1,S))."""
    if isinstance(item, dict):
        obs, actions, state = item["obs"], item["actions"], item["state"]
    elif isinstance(item, (tuple, list)):
        obs, actions, state = item
    else:  # EpisodeBatch or anything with the three attributes
        obs, actions, state = item.obs, item.actions, item.state
    obs, actions, state = np.asarray(obs), np.asarray(actions), np.asarray(state)
    if obs.ndim == 4:  # a single episode
        return [(obs, actions, state)]
    return [(obs[e], actions[e], state[e]) for e in range(obs.shape[0])]


class ClipSampler:
    """Uniform sampler over all valid clip starts of a set of episodes.

    ``episodes``: EpisodeBatch objects, dicts or (obs, actions, state) tuples, each holding one
    episode (obs (T+1, H, W, 3)) or a batch of them (obs (E, T+1, H, W, 3)); episodes may differ
    in length. ``clip_len`` is K (frames per clip, >= 2), ``action_block`` is b.
    """

    def __init__(self, episodes: Sequence, clip_len: int, action_block: int):
        if clip_len < 2 or action_block < 1:
            raise ConfigError(f"need clip_len >= 2 and action_block >= 1, got {clip_len}, {action_block}",
                              remediation="fix train.clip_len / model.action_block")
        self.clip_len, self.action_block = int(clip_len), int(action_block)
        eps = [e for item in episodes for e in _episode_arrays(item)]
        if not eps:
            raise ConfigError("no episodes to sample clips from", remediation="collect data first")
        span = self.action_block * (self.clip_len - 1)  # env steps covered by one clip
        frame_starts, action_starts = [], []
        frame_off = action_off = 0
        for obs, actions, state in eps:
            t1 = obs.shape[0]
            if actions.shape[0] != t1 - 1 or state.shape[0] != t1:
                raise ConfigError(
                    f"episode arrays disagree: obs {obs.shape}, actions {actions.shape}, state {state.shape}",
                    remediation="episodes need T+1 frames, T actions and T+1 states",
                )
            n_starts = t1 - span  # starts t = 0 .. T - span
            if n_starts > 0:
                frame_starts.append(frame_off + np.arange(n_starts))
                action_starts.append(action_off + np.arange(n_starts))
            frame_off += t1
            action_off += t1 - 1
        if not frame_starts:
            longest = max(e[0].shape[0] - 1 for e in eps)
            raise ConfigError(
                f"a clip spans {span} env steps (clip_len {clip_len}, action_block {action_block}) "
                f"but the longest episode has {longest}",
                remediation="lower train.clip_len or model.action_block, or collect longer episodes",
            )
        # One contiguous copy, channel-first, so a sample is a single gather with no permute.
        self.frames = torch.from_numpy(np.concatenate([e[0] for e in eps])).permute(0, 3, 1, 2).contiguous()
        self.actions = torch.from_numpy(np.concatenate([e[1] for e in eps]).astype(np.float32, copy=False))
        self.states = torch.from_numpy(np.concatenate([e[2] for e in eps]).astype(np.float32, copy=False))
        if self.frames.dtype != torch.uint8:
            raise ConfigError("observations must be uint8",
                              remediation="load shards with lensemble.data.load_shard")
        self._frame_starts = torch.from_numpy(np.concatenate(frame_starts)).long()
        self._action_starts = torch.from_numpy(np.concatenate(action_starts)).long()
        self._frame_steps = torch.arange(self.clip_len) * self.action_block   # (K,)
        self._action_steps = torch.arange(span)                                # (b(K-1),)
        self.num_episodes = len(eps)
        self.action_dim = int(self.actions.shape[1])

    def __len__(self) -> int:
        """Number of distinct clips (valid start positions)."""
        return int(self._frame_starts.numel())

    def clips_at(self, starts: torch.Tensor) -> Clips:
        """The clips at start indices ``starts`` (B,) in [0, len(self)); deterministic."""
        f0 = self._frame_starts[starts]                                 # (B,)
        a0 = self._action_starts[starts]
        fidx = f0[:, None] + self._frame_steps                          # (B, K)
        aidx = a0[:, None] + self._action_steps                         # (B, b(K-1))
        b, k = starts.numel(), self.clip_len
        # index_select on flattened indices: one contiguous gather, an order of magnitude faster
        # than advanced indexing with a 2-d index on CPU.
        obs = self.frames.index_select(0, fidx.reshape(-1)).view(b, k, *self.frames.shape[1:])
        state = self.states.index_select(0, fidx.reshape(-1)).view(b, k, -1)
        acts = self.actions.index_select(0, aidx.reshape(-1)).view(b, k - 1, self.action_block * self.action_dim)
        return Clips(obs=obs, actions=acts, state=state)

    def sample(self, batch_size: int, generator: torch.Generator) -> Clips:
        """``batch_size`` clips drawn uniformly (with replacement) over all valid starts."""
        starts = torch.randint(len(self), (int(batch_size),), generator=generator)
        return self.clips_at(starts)

    @classmethod
    def from_config(cls, episodes: Sequence, cfg) -> "ClipSampler":
        """K = ``cfg.train.clip_len``, b = ``cfg.model.action_block``."""
        return cls(episodes, cfg.train.clip_len, cfg.model.action_block)
