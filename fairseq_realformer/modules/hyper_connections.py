"""Hyper-Connections (Zhu et al., ICLR 2025, arXiv 2409.19606) and their manifold-constrained form
mHC (Xie et al., DeepSeek-AI, arXiv 2512.24880): n residual streams through a stack instead of one
(``--residual-streams N``), which every residual sublayer reads and writes.

Per token the streams are a matrix H ∈ R^{n×C} (``(T, B, n, C)`` for a batch, stream i in
``[:, :, i]``). They start as n copies of the embedded input, and the stack outputs LN(Σ_i H_i)
with its final LayerNorm. A residual sublayer T (self-attention, cross-attention or FFN, its own
Pre-LN LayerNorm inside T) has its connection matrix, A_m ∈ R^{n×1} (what it reads of each
stream), A_r ∈ R^{n×n} (how the streams mix) and B ∈ R^{1×n} (how its output is written), and
computes (the paper's Eq. 3-5)

    h₀ = Hᵀ A_m                        width connection: the sublayer's input
    H  ← A_rᵀ H + Bᵀ T(h₀)             depth connection (T(h₀) after the sublayer's dropout)

Static weights (SHC, ``--residual-streams-weights static``) are the parameters themselves; dynamic
ones (DHC, the default) add to them, for each stream i (row i of H̄ = LN(H), one LayerNorm over C
shared by the streams),

    [A_m A_r]_i += s_α · tanh(H̄_i W_α)        B_i += s_β · tanh(H̄_i W_β)

with W_α ∈ R^{C×(n+1)}, W_β ∈ R^C zero and the scalars s_α = s_β = 0.01 at initialisation (the
paper's Algorithm 2; parameters named as there). The static weights start as the paper's Pre-Norm:
the k-th residual sublayer of a stack (k = 0, 1, ...: 2 per encoder layer, 3 per decoder layer)
reads stream k mod n (A_m = e_k), nothing is mixed (A_r = I) and every stream receives the output
(B = 1). With every stream equal to Pre-LN's x, each becomes x + T(x): the streams stay copies of
Pre-LN's stream, and LN(n·x) is Pre-LN's output up to LayerNorm's ε.

mHC (``--residual-streams-mix mhc``) maps the same weights, computed without the tanh and with
one scale for the reads and one for the mix (the paper's α^pre, α^res; s_β is its α^post), onto
its manifolds:

    A_m = σ(Ã_m)        A_r = Sinkhorn(exp(Ã_r))        B = 2·σ(B̃)

Sinkhorn–Knopp alternately divides A_r's columns and its rows by their sums, 20 times (the mHC
paper's t_max; ``--residual-streams-sinkhorn-iterations``), so that A_r is (nearly) doubly
stochastic; the rows last, so that each stream hands on exactly all of itself and the mix keeps
the sum of the streams (computed in the log domain: ``sinkhorn``). Its initialisation: Ã = [e_k | I] as HC's, and B̃ = 0, so that B = 1: the
reads (0.73 for stream k, 0.5 for the others) are positive, a Pre-LN sublayer's LayerNorm takes
away their scale, and a doubly stochastic mix of equal streams leaves them equal: mHC too starts
as Pre-LN (up to LayerNorm's ε). hyper-connections 0.4.11 starts B̃ at 1 (B = 1.46), which does
not (docs/residual-paths.md).

Each connection computes in its streams' dtype with any autocast switched off (the stream mix is
a matrix product, which ``--bf16``'s autocast would round to bfloat16: the streams stay float32,
as Pre-LN's residual stream does); mHC's maps in float32. Everything is position-wise: incremental
decoding needs no cache of its own.
"""

import contextlib
from typing import NamedTuple, Optional, Tuple

import torch
from fairseq.modules import LayerNorm
from torch import Tensor, nn

MIXES = ("hc", "mhc")
SINKHORN_ITERATIONS = 20  # the mHC paper's t_max
DYNAMIC_SCALE = 0.01  # s_α, s_β at initialisation (the HC paper's Algorithm 2)


class Widened(NamedTuple):
    """What a width connection hands its depth connection."""

    streams: Tensor  # A_rᵀ H: the streams mixed, (T, B, n, C)
    beta: Tensor  # B: the write weights, (n,) static or (T, B, n) dynamic


def widen(x: Tensor, streams: int) -> Tensor:
    """n copies of the embedded input *x* ``(T, B, C)`` as streams ``(T, B, n, C)``."""
    return x.unsqueeze(2).expand(-1, -1, streams, -1)


def collapse(streams: Tensor) -> Tensor:
    """Σ_i H_i: what the stack outputs (before its LayerNorm), and reports as a layer's state."""
    return streams.sum(dim=2)


def sinkhorn(logits: Tensor, iterations: int) -> Tensor:
    """exp(*logits*) ``(..., n, n)`` made (nearly) doubly stochastic: its columns, then its rows,
    divided by their sums, *iterations* times (the rows last: they sum to 1 exactly). Computed in
    the log domain, a log-softmax over the columns, then one over the rows: the same matrix, to
    float32's rounding, as exp() and the divisions, without their underflow. Where logits of a
    column lie more than ~100 apart, exp() gives exact zeros: a row of zeros then stays zero (not
    doubly stochastic), and its gradients, amplified by each division by a floored sum, overflow
    to NaN; in the log domain such a row is scaled as any other."""
    for _ in range(iterations):
        logits = torch.log_softmax(logits, dim=-2)
        logits = torch.log_softmax(logits, dim=-1)
    return logits.exp()


def autocast_off(t: Tensor):
    """No autocast around the products of a connection (see above) or of an average (dense_residual)."""
    if t.device.type in ("cpu", "cuda"):
        return torch.autocast(device_type=t.device.type, enabled=False)
    return contextlib.nullcontext()


class HyperConnection(nn.Module):
    """The connection of one residual sublayer: ``width_connection`` before it,
    ``depth_connection`` after it.

    Args:
        streams: n.
        embed_dim: C.
        index: k, the sublayer's place in its stack from 0: it reads stream k mod n at first.
        mix: "hc" or "mhc".
        dynamic: DHC (weights from the streams too), else SHC.
        sinkhorn_iterations: mHC's t_max.
    """

    def __init__(
        self,
        streams: int,
        embed_dim: int,
        index: int,
        mix: str = "hc",
        dynamic: bool = True,
        sinkhorn_iterations: int = SINKHORN_ITERATIONS,
        export: bool = False,
    ):
        super().__init__()
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
        self.streams, self.mix, self.sinkhorn_iterations = streams, mix, sinkhorn_iterations
        read = torch.zeros(streams, 1)
        read[index % streams] = 1.0
        self.static_alpha = nn.Parameter(torch.cat([read, torch.eye(streams)], dim=1))  # [A_m | A_r]
        # B = 1: HC's weight itself; mHC's 2·σ(0)
        self.static_beta = nn.Parameter(torch.full((streams,), 1.0 if mix == "hc" else 0.0))
        self.norm: Optional[nn.Module] = LayerNorm(embed_dim, export=export) if dynamic else None
        if dynamic:
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(embed_dim, streams + 1))
            # HC: one s_α for reads and mix; mHC: α^pre, α^res
            self.dynamic_alpha_scale = nn.Parameter(torch.full((1 if mix == "hc" else 2,), DYNAMIC_SCALE))
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(embed_dim))
            self.dynamic_beta_scale = nn.Parameter(torch.full((1,), DYNAMIC_SCALE))

    def extra_repr(self) -> str:
        kind = "dynamic" if self.norm is not None else "static"
        iterations = f", sinkhorn_iterations={self.sinkhorn_iterations}" if self.mix == "mhc" else ""
        return f"streams={self.streams}, mix={self.mix}, {kind}{iterations}"

    def width_connection(self, streams: Tensor) -> Tuple[Tensor, Widened]:
        """h₀ = Hᵀ A_m ``(T, B, C)``, the sublayer's input, and what ``depth_connection`` needs."""
        with autocast_off(streams):
            alpha, beta = self.weights(streams)
            mixed = alpha.transpose(-1, -2) @ streams  # (..., 1 + n, C): [h₀; A_rᵀ H]
        # h₀ is copied: a view of it, saved for backward by the sublayer's LayerNorm, would keep all
        # of `mixed` ((1 + n)·C per token) alive until the backward pass, -19 % saved bytes at n = 4.
        return mixed[..., 0, :].contiguous(), Widened(mixed[..., 1:, :], beta)

    def depth_connection(self, branch: Tensor, widened: Widened) -> Tensor:
        """A_rᵀ H + Bᵀ T(h₀), *branch* T(h₀) ``(T, B, C)``."""
        with autocast_off(branch):
            dtype = widened.streams.dtype
            return widened.streams + widened.beta.unsqueeze(-1) * branch.to(dtype).unsqueeze(-2)

    def weights(self, streams: Tensor) -> Tuple[Tensor, Tensor]:
        """[A_m | A_r] ``(n, 1 + n)`` and B ``(n,)`` (static), or per token ``(T, B, n, 1 + n)`` and
        ``(T, B, n)`` (dynamic), after mHC's maps; in the streams' dtype."""
        alpha, beta = self.static_alpha, self.static_beta
        if self.norm is not None:
            normed = self.norm(streams)
            dynamic_alpha, dynamic_beta = normed @ self.dynamic_alpha_fn, normed @ self.dynamic_beta_fn
            if self.mix == "hc":
                dynamic_alpha, dynamic_beta = torch.tanh(dynamic_alpha), torch.tanh(dynamic_beta)
            alpha = alpha + self._alpha_scale() * dynamic_alpha
            beta = beta + self.dynamic_beta_scale * dynamic_beta
        if self.mix == "mhc":
            alpha, beta = alpha.float(), beta.float()
            mix = sinkhorn(alpha[..., 1:], self.sinkhorn_iterations)
            alpha = torch.cat([torch.sigmoid(alpha[..., :1]), mix], dim=-1)
            beta = 2 * torch.sigmoid(beta)
        return alpha.to(streams.dtype), beta.to(streams.dtype)

    def _alpha_scale(self) -> Tensor:
        """s_α for every column of [A_m | A_r]: one scale (HC), or α^pre then α^res n times (mHC)."""
        scale = self.dynamic_alpha_scale
        if self.mix == "hc":
            return scale
        return torch.cat([scale[:1], scale[1:].expand(self.streams)])
