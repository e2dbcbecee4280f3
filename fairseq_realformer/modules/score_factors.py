"""The running sum of scores as one product (``--residual-attention-kernel concat``, issue 41):

    S_n = Σ_{i≤n} Q_i K_iᵀ / √d = [Q_1‖…‖Q_n] [K_1‖…‖K_n]ᵀ / √d

(‖: side by side along the head dimension). So layer n of a residual score path is a standard
attention whose queries and keys are n head-widths wide:

    softmax(S_n / n + mask) V_n = SDPA([Q_1‖…‖Q_n], [K_1‖…‖K_n], V_n, mask, scale 1/(n√d))

No score tensor is formed, carried or masked: each layer applies only its own masks, so "the
carried sum is unmasked" holds by construction, and the product runs inside the fused kernel.

What a layer hands on is ``ScoreFactors``: [Q_1‖…‖Q_n] and [K_1‖…‖K_n]. Concatenating afresh at
every layer would leave n head-widths of queries and keys saved for backward by layer n, N²/2
over a stack of N. Instead a path's layers write their Q_n and K_n once each into one buffer per
factor (``_Buffers``, made by the path's first layer), and layer n's factors are views of the
buffer's first n slots: the attention kernel saves views, and the memory stays O(N). The buffers
are written through aliases with their own version counters, so writing slot n + 1 does not
invalidate what layer n saved: no layer ever writes a slot another has read. In backward, the
gradient of layer n's factors is the sum of its own attention's and layer n + 1's (autograd adds
them: one kernel per factor and layer, as the eager chain adds the carried scores' gradients);
its last slot is Q_n's and K_n's, the rest goes to layer n − 1.

The buffers are laid out ``(length, batch · heads, slots · head_dim)``, as the projections write
their outputs, so filling a slot is one coalesced copy; the kernel reads the heads as views.
"""

from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor


class _Buffers:
    """The slots of one path's factors in one forward pass, and the path's additive mask."""

    def __init__(self, q: Tensor, k: Tensor, slots: int):
        head_dim = q.size(-1)
        self.head_dim, self.filled = head_dim, 0
        # (length, batch · heads, slots · head_dim); q and k arrive as (batch · heads, length, head_dim)
        self.queries = q.new_empty(q.size(1), q.size(0), slots * head_dim)
        self.keys = k.new_empty(k.size(1), k.size(0), slots * head_dim)
        # the same memory under version counters of their own (``.data``): the kernels that read
        # slots 1..n keep their views valid while slot n + 1 is written
        self._queries, self._keys = self.queries.data, self.keys.data
        self._mask_for, self._mask = None, None

    @property
    def slots(self) -> int:
        return self.queries.size(-1) // self.head_dim

    def resized(self, filled: int, slots: int) -> "_Buffers":
        """New buffers of *slots* slots holding a copy of this one's first *filled*: a path deeper
        than it was built for, or one that branches (a layer's factors extended twice)."""
        other = _Buffers.__new__(_Buffers)
        other.__dict__.update(self.__dict__)
        width = filled * self.head_dim
        other.queries = self.queries.new_empty(*self.queries.shape[:-1], slots * self.head_dim)
        other.keys = self.keys.new_empty(*self.keys.shape[:-1], slots * self.head_dim)
        other._queries, other._keys, other.filled = other.queries.data, other.keys.data, filled
        other._queries[..., :width].copy_(self._queries[..., :width])
        other._keys[..., :width].copy_(self._keys[..., :width])
        return other

    def mask(self, attn_mask, key_padding_mask, build: Callable[[], Optional[Tensor]]) -> Optional[Tensor]:
        """The layer's masks as the bias *build* makes of them, built once for the masks the path's
        layers share."""
        if self._mask_for is None or self._mask_for[0] is not attn_mask or self._mask_for[1] is not key_padding_mask:
            self._mask_for, self._mask = (attn_mask, key_padding_mask), build()
        return self._mask


class ScoreFactors(NamedTuple):
    """What a layer on a ``concat`` score path hands on: S_n's factors, each
    ``(length, batch · heads, n · head_dim)``, views of the path's buffers."""

    queries: Tensor  # [Q_1‖…‖Q_n]
    keys: Tensor  # [K_1‖…‖K_n]
    buffers: _Buffers

    @property
    def layers(self) -> int:
        return self.queries.size(-1) // self.buffers.head_dim

    def per_head(self, factor: Tensor) -> Tensor:
        """*factor* as ``(batch · heads, length, n · head_dim)``, the eager chain's layout: a view."""
        return factor.transpose(0, 1)


class _Append(torch.autograd.Function):
    """[X_{n-1} ‖ x_n] for both factors, x_n written into slot n of the path's buffers."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, prev_queries, prev_keys, buffers: _Buffers):
        slot, width = buffers.filled, buffers.head_dim
        low, high = slot * width, (slot + 1) * width
        buffers._queries[..., low:high].copy_(q.transpose(0, 1))
        buffers._keys[..., low:high].copy_(k.transpose(0, 1))
        buffers.filled = slot + 1
        ctx.low, ctx.first = low, prev_queries is None
        return buffers.queries[..., :high], buffers.keys[..., :high]

    @staticmethod
    def backward(ctx, grad_queries: Tensor, grad_keys: Tensor):
        low = ctx.low
        # this layer's slot is its q's and k's gradient; the slots before it are the previous layer's
        grads = [g[..., low:].transpose(0, 1) for g in (grad_queries, grad_keys)]
        prev = [None, None] if ctx.first else [g[..., :low] for g in (grad_queries, grad_keys)]
        return grads[0], grads[1], prev[0], prev[1], None


def append(factors: Optional[ScoreFactors], q: Tensor, k: Tensor, slots: Optional[int]) -> ScoreFactors:
    """Layer n's factors from layer n − 1's (None on the path's first layer) and this layer's q and
    k, ``(batch · heads, length, head_dim)``. *slots*: the path's layers, the buffers' size (they
    grow if a path runs deeper)."""
    if factors is None:
        buffers, prev_queries, prev_keys = _Buffers(q, k, slots or 1), None, None
    else:
        prev_queries, prev_keys, buffers = factors
        layers = factors.layers
        if buffers.filled != layers or layers == buffers.slots:
            buffers = buffers.resized(layers, max(buffers.slots, 2 * layers))
    queries, keys = _Append.apply(q, k, prev_queries, prev_keys, buffers)
    return ScoreFactors(queries, keys, buffers)
