"""timm's ViT layers with their matrix products placed for bf16 autocast on a CPU (``train.precision``,
``eval.precision``; lensemble/model/precision.py).

Under bf16 autocast most of the ViT's products (qkv, output projection, MLP) run fastest in bf16 on
the CPU's matrix units. Two of torch's CPU kernels do not (measured with ``benchmarks/bench_precision.py``
on an AMX Xeon, torch 2.14, one thread, a CPU-preset training step):

* flash attention: its bf16 backward took 12x its fp32 time (a training step 491 ms in bf16 against
  347 ms in fp32, 231 ms with attention in fp32); :class:`ViTAttention` routes it through
  :func:`~lensemble.model.precision.attention`.
* the patch embedding's strided convolution: its bf16 backward took 3x its fp32 time (38 against
  13 ms per step); :class:`PatchConv` runs it in fp32 while gradients are recorded. Its bf16 forward
  is twice as fast as fp32, so planning and evaluation (no gradients) keep it.

Both compute exactly timm's layers on fp32 inputs (tested bitwise), with the same parameters,
state-dict names and initialisation, so fp32 runs and every checkpoint are unchanged.
"""

from __future__ import annotations

import torch
from timm.layers.attention import Attention as TimmAttention
from torch import nn

from lensemble.model.precision import attention, full_precision


class ViTAttention(TimmAttention):
    """timm's ViT self-attention with its fused product through :func:`~lensemble.model.precision.attention`.

    ``forward(x)``: x (B, N, C) -> (B, N, C).
    """

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        if not self.fused_attn:  # timm's explicit product (TIMM_FUSED_ATTN=0): nothing to route
            return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)
        b, n, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = attention(q, k, v, attn_mask=attn_mask, dropout_p=self.attn_drop.p if self.training else 0.0,
                      is_causal=is_causal)
        x = self.norm(x.transpose(1, 2).reshape(b, n, self.attn_dim))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


class PatchConv(nn.Conv2d):
    """The patch embedding's convolution: in fp32 under CPU bf16 autocast while gradients are
    recorded (training), as autocast leaves it otherwise.

    ``forward(x)``: x (B, 3, H, W) -> (B, embed_dim, H / patch, W / patch); fp32 in training under
    bf16 autocast (the next LayerNorm runs in fp32 anyway), else the dtype autocast gives it.
    """

    @classmethod
    def like(cls, conv: nn.Conv2d) -> PatchConv:
        """A PatchConv with ``conv``'s shape and its parameters (the same tensors, not copies)."""
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                  dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode, device="meta")
        new.weight, new.bias = conv.weight, conv.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and torch.is_grad_enabled() and torch.is_autocast_enabled("cpu"):
            with full_precision(x):
                return super().forward(x.float())
        return super().forward(x)


__all__ = ["PatchConv", "ViTAttention"]
