"""DenseFormer's depth-weighted average (DWA; Pagliardini et al., "DenseFormer: Enhancing
Information Flow in Transformers via Depth Weighted Averaging", NeurIPS 2024):
``--dense-residual dwa``, after every layer of both stacks.

A stack of L layers keeps every layer's output. X_0 is the embedded input (after fairseq's
embedding dropout and, in the encoder, padding zeroed); layer i (from 1) reads Y_{i-1} and outputs
X_i; what the stack hands on after it is the weighted average

    Y_i = Σ_j α_{i,j} X_j      over j = i, i − k, i − 2k, ... ≥ 0        (k: the dilation)

after every p-th layer (i mod p = 0; p: the period), and Y_i = X_i after the others (the paper's
Eq. 1 with its k×p variants; ``--dense-residual-dilation`` and ``--dense-residual-period``, both 1
by default: the paper's DenseFormer, whose cheaper 4×5 it recommends at scale). The weights start
as α_{i,i} = 1 and the others 0, so that a new model computes its backbone's outputs exactly; the
last layer's average is the stack's output, which Pre-LN and ReZero then normalise or hand on as
their own (``models/realformer.py``). The weights of the average after layer i are the parameter
``<stack>.dense_residual.alphas.<i − 1>``, over the X_j from the earliest (j = i mod k) to X_i,
as the authors' ``DWAModules`` (epfml/DenseFormer, ``denseformer/denseformer.py``) orders them.

Under LayerDrop a dropped layer is an identity: its output is its input (X_i = Y_{i-1}), and the
average after it is taken as after any other layer, so every weight keeps its meaning.

Each X_j is written once into one buffer per residue class of j mod k, and each average reads a
prefix of its class's buffer without copying it (``_Append``, the authors' way), so memory grows as
L states, not L²/2, and an average is one matrix product. The averages run in the states' dtype
with any autocast switched off: ``--bf16``'s autocast would round that product to bfloat16, and
the residual stream stays float32. Everything is position-wise: incremental decoding needs no
cache of its own, and beam search nothing to reorder.
"""

from typing import List, Optional

import torch
from torch import Tensor, nn

from .hyper_connections import autocast_off

DENSE_RESIDUALS = ("none", "dwa")
DILATION = 1  # the paper's DenseFormer (1x1); its 4x5 variant: dilation 4, period 5
PERIOD = 1


def averages_after(layer: int, period: int) -> bool:
    """The stack averages after *layer* (from 1)."""
    return layer % period == 0


def states_averaged(layer: int, dilation: int) -> int:
    """How many states the average after *layer* (from 1) weighs: X_j, j ≡ layer (mod dilation)."""
    return layer // dilation + 1


class DepthWeightedAverage(nn.Module):
    """The DWA weights of one stack of *layers* layers, and the averages of one forward pass
    (``start``)."""

    def __init__(self, layers: int, dilation: int = DILATION, period: int = PERIOD):
        super().__init__()
        self.layers, self.dilation, self.period = layers, dilation, period
        self.alphas = nn.ParameterDict()
        for i in range(1, layers + 1):
            if averages_after(i, period):
                alpha = torch.zeros(states_averaged(i, dilation))
                alpha[-1] = 1.0  # Y_i = X_i: the backbone
                self.alphas[str(i - 1)] = nn.Parameter(alpha)

    def extra_repr(self) -> str:
        return f"layers={self.layers}, dilation={self.dilation}, period={self.period}"

    def start(self, embedded: Tensor) -> "DepthStates":
        """The states of one forward pass, holding X_0 = *embedded*."""
        return DepthStates(self, embedded)


class DepthStates:
    """X_0, X_1, ... of one forward pass through a stack, in one buffer per residue class mod k."""

    def __init__(self, average: DepthWeightedAverage, embedded: Tensor):
        self.average = average
        k, count = average.dilation, average.layers + 1  # X_0 .. X_L
        self.buffers = [embedded.new_zeros(((count - r + k - 1) // k, *embedded.shape)) for r in range(k)]
        self.written: List[Optional[Tensor]] = [None] * k  # each class's X_j so far, a view of its buffer
        self.passed = 0  # the layers whose output is kept: X_0 .. X_passed
        self._append(0, embedded)

    def skip_to(self, index: int, x: Tensor) -> Tensor:
        """What layer *index* (from 0; the stack's length: its output) reads, given *x*, what the
        last layer run handed on: the layers LayerDrop skipped since are identities, each followed
        by its average."""
        while self.passed < index:
            x = self.after(self.passed, x)
        return x

    def after(self, index: int, x: Tensor) -> Tensor:
        """What the stack hands on after its layer *index* (from 0), whose output is *x*."""
        self.passed = layer = index + 1
        states = self._append(layer, x)
        if not averages_after(layer, self.average.period):
            return x
        alpha = self.average.alphas[str(index)]
        with autocast_off(x):
            return torch.tensordot(alpha.to(states.dtype), states, dims=1)

    def _append(self, j: int, x: Tensor) -> Tensor:
        k = self.average.dilation
        r, slot = j % k, j // k
        self.written[r] = _Append.apply(self.buffers[r], self.written[r], slot, x)
        return self.written[r]


class _Append(torch.autograd.Function):
    """Writes X_j into slot j // k of its class's buffer and returns the slots written so far as a
    tensor of their own (not a view: a later write must not invalidate the prefix an earlier
    average saved for its backward). Its gradient goes to X_j and to the earlier prefix."""

    @staticmethod
    def forward(ctx, buffer: Tensor, before: Optional[Tensor], slot: int, x: Tensor) -> Tensor:
        buffer[slot] = x
        ctx.slot = slot
        prefix = buffer.new_empty(0)
        prefix.set_(buffer.untyped_storage(), buffer.storage_offset(), (slot + 1, *buffer.shape[1:]), buffer.stride())
        return prefix

    @staticmethod
    def backward(ctx, grad: Tensor):
        before = grad[: ctx.slot] if ctx.slot > 0 else None
        return None, before, None, grad[ctx.slot]
