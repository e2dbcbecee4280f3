"""One definition per backbone: how each residual sublayer f (self-attention, cross-attention or
FFN) wraps its input x, where the LayerNorms are, what is initialised, and the stack's own stream.

    post-ln    x ← LN(x + f(x))
    pre-ln     x ← x + f(LN(x)); LN after the stack
    admin      x ← LN(x·ω + f(x)), ω a trainable per-channel vector per sublayer (ADMIN)
    deepnorm   x ← LN(α·x + f(x)), α fixed per stack; value/output/FFN weights scaled by β (DeepNet)
    rezero     x ← x + α·f(x), α a trainable scalar per sublayer, initialised to 0; no LayerNorm
    t-fixup    x ← x + f(x), no LayerNorm; value/output/FFN weights and embeddings depth-scaled
    resi-dual  x ← LN(x + f(x)) and d ← d + f(x), d starting from the embedded input; the stack
               outputs x + LN(d) (ResiDual)

``options`` (flags, checks), ``layers`` (the sublayers' wiring) and ``admin`` read these entries;
a new backbone is one new entry of ``BACKBONES``.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor, nn

from .admin import initial_omega

# DeepNorm and T-Fixup scale these projections at initialisation; queries and keys keep theirs
DEPTH_SCALED = ("fc1", "fc2", "v_proj", "out_proj")


@dataclass(frozen=True)
class SublayerWeight:
    """A trainable weight of every residual sublayer's join, ``<sublayer>_<name>``."""

    name: str
    per_channel: bool  # a vector over the model dimension, else one scalar
    initial: Callable  # (options, layers of the stack, side) -> its value at construction
    from_data: bool = False  # can be set from data before training (ADMIN: --admin-init profile / -path)


@dataclass(frozen=True)
class StackStream:
    """A second residual stream through a whole stack, beside x: it starts from the embedded
    input (after fairseq's embedding dropout and padding zeroing), every sublayer adds its
    branch f(x) (after dropout), and the stack outputs ``x + LN(stream)`` with the stack's
    LayerNorm (``layer_norm``), built with *layer_norm_eps*."""

    layer_norm_eps: float


@dataclass(frozen=True)
class Backbone:
    """One backbone. *join(branch, residual, weight)* joins a sublayer's input (``residual``) and
    its branch f(x) after dropout; *weight* is the sublayer's ``SublayerWeight`` if it has one,
    else the layer's ``residual_alpha`` (1.0; DeepNorm's α)."""

    formula: str  # one sublayer, as ``--help`` shows it
    layer_norm: Optional[str]  # "after" the join, "before" f (and after the stack), or None: no LayerNorm
    join: Callable[[Tensor, Tensor, object], Tensor]
    weight: Optional[SublayerWeight] = None
    init_layer: Optional[Callable] = None  # (layer, cfg, side): after fairseq initialised the layer
    init_embeddings: Optional[Callable] = None  # (cfg, embed_tokens, side): after fairseq's N(0, d^-1/2)
    stack_stream: Optional[StackStream] = None


# --- how a sublayer joins its input and its branch ------------------------------------------------


def join_sum(x: Tensor, residual: Tensor, weight) -> Tensor:
    return residual + x


# ADMIN's and ReZero's joins are one ``addcmul``: six kernels forward and backward, where an
# autograd Function of its own takes four. But on a GPU at NMT batch sizes a step waits on the host,
# and such a Function's Python forward and backward cost the host more than the kernels they save
# (benchmarks/RESULTS.md, "bf16 mixed precision on a CPU").


def join_scaled_residual(x: Tensor, residual: Tensor, omega: Tensor) -> Tensor:
    return torch.addcmul(x, residual, omega)  # ADMIN: x·ω + f(x)


def join_alpha_residual(x: Tensor, residual: Tensor, alpha: float) -> Tensor:
    return torch.add(x, residual, alpha=alpha)  # DeepNorm: α·x + f(x)


def join_scaled_branch(x: Tensor, residual: Tensor, alpha: Tensor) -> Tensor:
    return torch.addcmul(residual, x, alpha)  # ReZero: x + α·f(x)


# --- DeepNorm ---------------------------------------------------------------------------------------


def deepnorm_alpha_beta(encoder_layers: int, decoder_layers: int, side: str) -> Tuple[float, float]:
    """DeepNet's α and β for an encoder-decoder of N encoder and M decoder layers (the paper's
    constants; torchscale's code uses 1.15 instead of 0.87 for the encoder's β):

        encoder  α = 0.81·(N⁴M)^(1/16),  β = 0.87·(N⁴M)^(−1/16)
        decoder  α = (3M)^(1/4),          β = (12M)^(−1/4)
    """
    n, m = encoder_layers, decoder_layers
    if side == "encoder":
        return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
    if side == "decoder":
        return (3 * m) ** (1 / 4), (12 * m) ** (-1 / 4)
    raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")


def _deepnorm_init_layer(layer, cfg, side: str) -> None:
    layer.residual_alpha, beta = deepnorm_alpha_beta(cfg.encoder.layers, cfg.decoder.layers, side)
    scale_projections(layer, beta, weights_only=False)


@torch.no_grad()
def scale_projections(layer: nn.Module, scale: float, weights_only: bool) -> None:
    """Multiply the value, output and FFN projections (DEPTH_SCALED) of *layer* by *scale*."""
    for name, p in layer.named_parameters():
        *_, module, kind = ("", *name.split("."))
        if module in DEPTH_SCALED and (kind == "weight" or not weights_only):
            p.mul_(scale)


# --- T-Fixup ----------------------------------------------------------------------------------------


def tfixup_scales(encoder_layers: int, decoder_layers: int, side: str) -> Tuple[float, float]:
    """T-Fixup's (layer weights, input embedding) scales for one stack, as its official code
    (layer6ai-labs/T-Fixup) applies them:

        encoder  value/output/FFN weights × 0.67·N_e^(−1/4),  embeddings × (9·N_e)^(−1/4)
        decoder  value/output/FFN weights × (9·N_d)^(−1/4),   embeddings × (9·N_d)^(−1/4)

    (the paper's text gives the encoder embeddings 0.67·N_e^(−1/4); its code, used here, (9·N_e)^(−1/4)).
    """
    n, m = encoder_layers, decoder_layers
    if side == "encoder":
        return 0.67 * n ** (-1 / 4), (9 * n) ** (-1 / 4)
    if side == "decoder":
        return (9 * m) ** (-1 / 4), (9 * m) ** (-1 / 4)
    raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")


@torch.no_grad()
def _tfixup_init_layer(layer, cfg, side: str) -> None:
    """T-Fixup (Huang et al. 2020): Xavier-uniform weights (fairseq's FFN layers are torch's
    default Linear, its value projection Xavier with gain 1/√2: both re-drawn as Xavier with
    gain 1, FFN biases 0), then the value, output and FFN weights × the stack's scale."""
    for fc in (layer.fc1, layer.fc2):
        nn.init.xavier_uniform_(fc.weight)
        nn.init.zeros_(fc.bias)
    for attention in (layer.self_attn, getattr(layer, "encoder_attn", None)):
        if attention is not None and attention.qkv_same_dim:
            attention.v_proj.weight.mul_(math.sqrt(2))  # gain 1/√2 → 1, as T-Fixup's code
    scale_projections(layer, tfixup_scales(cfg.encoder.layers, cfg.decoder.layers, side)[0], weights_only=True)


@torch.no_grad()
def _tfixup_init_embeddings(cfg, embed_tokens: nn.Embedding, side: str) -> None:
    """Shared embeddings (--share-all-embeddings) are scaled once, by the encoder, as T-Fixup's
    code does."""
    if not (side == "decoder" and cfg.share_all_embeddings):
        embed_tokens.weight.mul_(tfixup_scales(cfg.encoder.layers, cfg.decoder.layers, side)[1])


# --- the backbones ----------------------------------------------------------------------------------

BACKBONES = {
    "post-ln": Backbone("LN(x + f(x))", "after", join_sum),
    "pre-ln": Backbone("x + f(LN(x))", "before", join_sum),
    "admin": Backbone(
        "LN(x*omega + f(x)), omega a trainable per-channel vector (Liu et al. 2020)",
        "after",
        join_scaled_residual,
        weight=SublayerWeight("omega", per_channel=True, initial=initial_omega, from_data=True),
    ),
    "deepnorm": Backbone(
        "LN(alpha*x + f(x)) with DeepNet's alpha and beta-scaled initialisation (Wang et al. 2022)",
        "after",
        join_alpha_residual,
        init_layer=_deepnorm_init_layer,
    ),
    "rezero": Backbone(
        "x + alpha*f(x), alpha a trainable scalar initialised to 0, no LayerNorm (Bachlechner et al. 2020)",
        None,
        join_scaled_branch,  # every layer starts as the identity
        weight=SublayerWeight("resweight", per_channel=False, initial=lambda options, layers, side: 0.0),
    ),
    "t-fixup": Backbone(
        "x + f(x), no LayerNorm, T-Fixup's depth-scaled initialisation (Huang et al. 2020)",
        None,
        join_sum,
        init_layer=_tfixup_init_layer,
        init_embeddings=_tfixup_init_embeddings,
    ),
    "resi-dual": Backbone(
        "LN(x + f(x)) beside a dual stream d + f(x) from the embedded input; stack output x + LN(d) (Xie et al. 2023)",
        "after",
        join_sum,
        # eps as microsoft/ResiDual's stack LayerNorm
        stack_stream=StackStream(layer_norm_eps=1e-7),
    ),
}
