"""Encoder and decoder layers on every backbone, carrying attention scores.

Backbones (one residual sublayer f: self-attention, cross-attention or FFN):

    post-ln   x ← LN(x + f(x))
    pre-ln    x ← x + f(LN(x))
    admin     x ← LN(x·ω + f(x)), ω a trainable per-channel vector per sublayer (ADMIN)
    deepnorm  x ← LN(α·x + f(x)), α fixed per stack; value/output/FFN weights scaled by β (DeepNet)
    rezero    x ← x + α·f(x), α a trainable scalar per sublayer, initialised to 0; no LayerNorm
    t-fixup   x ← x + f(x), no LayerNorm; value/output/FFN weights and embeddings depth-scaled

The residual wiring and the initialisation of every backbone are here (``_Backbone``,
``deepnorm_alpha_beta``, ``tfixup_scales``, ``initialize_embeddings``); which backbone, which
score paths and which running-mean mode come from the model's ``RealformerOptions``. On a
residual-attention path a layer takes the previous layer's carried scores and returns its own
(see ``residual_attention``); off the path it uses fairseq's own attention module, fused SDPA path
included, so a path that is switched off costs nothing.
"""
import math
from functools import partial
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from .admin import initial_omega
from .residual_attention import Carried, ResidualMultiheadAttention

# The residual sublayers of a layer, in the order they run.
SUBLAYERS = {"encoder": ("self_attn", "ffn"), "decoder": ("self_attn", "encoder_attn", "ffn")}
# DeepNorm and T-Fixup scale these projections at initialisation; queries and keys keep theirs
DEPTH_SCALED = ("fc1", "fc2", "v_proj", "out_proj")


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
def initialize_embeddings(options, cfg, embed_tokens: nn.Embedding, side: str) -> None:
    """What a backbone does to a stack's input embeddings at construction (T-Fixup scales them;
    the others keep fairseq's N(0, d^-1/2)). Shared embeddings (--share-all-embeddings) are
    scaled once, by the encoder, as T-Fixup's code does."""
    if options.backbone == "t-fixup" and not (side == "decoder" and cfg.share_all_embeddings):
        embed_tokens.weight.mul_(tfixup_scales(cfg.encoder.layers, cfg.decoder.layers, side)[1])


class Carry(NamedTuple):
    """What a layer hands the next besides x: what each attention path carries, keyed by path
    (a path that carries nothing keeps ``Carried()``)."""

    encoder: Carried = Carried()
    decoder: Carried = Carried()
    cross: Carried = Carried()


def _join_sum(x: Tensor, residual: Tensor, weight) -> Tensor:
    return residual + x


def _join_scaled_residual(x: Tensor, residual: Tensor, omega: Tensor) -> Tensor:
    return torch.addcmul(x, residual, omega)  # ADMIN: x·ω + f(x)


def _join_alpha_residual(x: Tensor, residual: Tensor, alpha: float) -> Tensor:
    return torch.add(x, residual, alpha=alpha)  # DeepNorm: α·x + f(x)


def _join_scaled_branch(x: Tensor, residual: Tensor, alpha: Tensor) -> Tensor:
    return torch.addcmul(residual, x, alpha)  # ReZero: x + α·f(x)


# backbone: (how a sublayer joins x and f(x), the name of its per-sublayer trainable weight)
_WIRING = {
    "post-ln": (_join_sum, None),
    "pre-ln": (_join_sum, None),
    "admin": (_join_scaled_residual, "omega"),
    "deepnorm": (_join_alpha_residual, None),
    "rezero": (_join_scaled_branch, "resweight"),
    "t-fixup": (_join_sum, None),
}


class _Backbone:
    """The residual wiring shared by encoder and decoder layers (a mixin over fairseq's layers,
    which build the sublayers; ``options`` must be set before their ``__init__`` runs)."""

    # Set on every layer of a stack during ADMIN's profiling pass (see admin.AdminProfiler).
    admin_profiler = None
    # DeepNorm's α (1.0 on the other backbones)
    residual_alpha = 1.0

    def _init_backbone(self, cfg, side: str, sublayers) -> None:
        """The backbone's parameters and initialisation, after fairseq built the *sublayers*:
        ADMIN's ω (``<sublayer>_omega``), ReZero's α (``<sublayer>_resweight``), DeepNorm's α
        and β, T-Fixup's scaled weights; no LayerNorms for a backbone without them."""
        backbone = self.options.backbone
        self._join, weight_name = _WIRING[backbone]
        layers = cfg.encoder.layers if side == "encoder" else cfg.decoder.layers
        self._weight_names = {}
        for sublayer in sublayers:
            self._weight_names[sublayer] = f"{sublayer}_{weight_name}" if weight_name else None
            omega = None
            if backbone == "admin":
                omega = nn.Parameter(torch.full((self.embed_dim,), initial_omega(self.options, layers, side)))
            setattr(self, f"{sublayer}_omega", omega)
            if backbone == "rezero":  # every layer starts as the identity
                setattr(self, f"{sublayer}_resweight", nn.Parameter(torch.zeros(1)))
        self.normalize_after = self.options.layer_norm and not self.normalize_before
        if not self.options.layer_norm:
            self.self_attn_layer_norm = self.final_layer_norm = None
            if side == "decoder":
                self.encoder_attn_layer_norm = None
        if backbone == "deepnorm":
            self.residual_alpha, beta = deepnorm_alpha_beta(cfg.encoder.layers, cfg.decoder.layers, side)
            self._scale_projections(beta, weights_only=False)
        elif backbone == "t-fixup":
            self._tfixup_initialization(tfixup_scales(cfg.encoder.layers, cfg.decoder.layers, side)[0])

    @torch.no_grad()
    def _scale_projections(self, scale: float, weights_only: bool) -> None:
        """Multiply the value, output and FFN projections (DEPTH_SCALED) by *scale*."""
        for name, p in self.named_parameters():
            *_, module, kind = ("", *name.split("."))
            if module in DEPTH_SCALED and (kind == "weight" or not weights_only):
                p.mul_(scale)

    @torch.no_grad()
    def _tfixup_initialization(self, scale: float) -> None:
        """T-Fixup (Huang et al. 2020): Xavier-uniform weights (fairseq's FFN layers are
        torch's default Linear, its value projection Xavier with gain 1/√2: both re-drawn as
        Xavier with gain 1, FFN biases 0), then the value, output and FFN weights × *scale*."""
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)
        for attention in (self.self_attn, getattr(self, "encoder_attn", None)):
            if attention is not None and attention.qkv_same_dim:
                attention.v_proj.weight.mul_(math.sqrt(2))  # gain 1/√2 → 1, as T-Fixup's code
        self._scale_projections(scale, weights_only=True)

    def _weight(self, sublayer: str):
        """The sublayer's backbone weight: ADMIN's ω or ReZero's α (trainable), else DeepNorm's α."""
        name = self._weight_names[sublayer]
        return getattr(self, name) if name else self.residual_alpha

    def _residual_attention(self, cfg, path: str, embed_dim: int, heads: int, build_fairseqs, **kwargs):
        """The attention module of a sublayer on score *path*: ours on a residual path, else
        fairseq's own, built by *build_fairseqs* (its layer's build method)."""
        if path not in self.options.paths:
            return build_fairseqs()
        return ResidualMultiheadAttention(
            embed_dim,
            heads,
            running_mean=self.options.running_mean,
            dropout=cfg.attention_dropout,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            **kwargs,
        )

    def _pre(self, x: Tensor, layer_norm: Optional[nn.Module]) -> Tensor:
        return layer_norm(x) if self.normalize_before else x

    def _post(self, x: Tensor, residual: Tensor, sublayer: str, layer_norm: Optional[nn.Module]) -> Tensor:
        """Dropout on the branch, the backbone's join with the residual, LayerNorm after it."""
        x = self.dropout_module(x)
        weight = self._weight(sublayer)
        if self.admin_profiler is not None:
            self.admin_profiler(weight, residual, x)  # sets ω from this sublayer's statistics
        x = self._join(x, residual, weight)
        return layer_norm(x) if self.normalize_after else x

    def _attention_sublayer(self, x: Tensor, sublayer: str, path: str, carry: Carry, depth: int,
                            key_value: Optional[Tensor] = None, **kwargs):  # fmt: skip
        """One attention sublayer ("self_attn" or "encoder_attn") on score *path*, pre → attend
        → post. Self-attention when *key_value* is None. Returns (x, attention weights if asked
        for, *carry* with what this path hands on)."""
        attention, layer_norm = getattr(self, sublayer), getattr(self, f"{sublayer}_layer_norm")
        residual = x
        x = self._pre(x, layer_norm)
        key_value = x if key_value is None else key_value
        if isinstance(attention, ResidualMultiheadAttention):
            x, weights, carried = attention(query=x, key=key_value, value=key_value, **kwargs, carried=getattr(carry, path), depth=depth)
            carry = carry._replace(**{path: carried})
        else:  # fairseq's own module: this path carries nothing
            x, weights = attention(query=x, key=key_value, value=key_value, **kwargs)
        return self._post(x, residual, sublayer, layer_norm), weights, carry

    def _feed_forward(self, x: Tensor) -> Tensor:
        residual = x
        x = self._pre(x, self.final_layer_norm)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.fc2(x)
        return self._post(x, residual, "ffn", self.final_layer_norm)


class RealformerEncoderLayer(_Backbone, TransformerEncoderLayerBase):
    """fairseq's encoder layer (same sublayers and parameter names) with carried scores and ω.

    ``forward`` is replaced: it takes and returns what the score paths carry and scales the residual.
    """

    def __init__(self, cfg, options):
        self.options = options  # read by build_self_attention during fairseq's __init__
        super().__init__(cfg)
        self._init_backbone(cfg, "encoder", SUBLAYERS["encoder"])

    def sublayer_omegas(self):
        """ADMIN's ω in the order the sublayers run."""
        return [self.self_attn_omega, self.ffn_omega]

    def build_self_attention(self, embed_dim, cfg):
        return self._residual_attention(
            cfg, "encoder", embed_dim, cfg.encoder.attention_heads,
            partial(super().build_self_attention, embed_dim, cfg),
            self_attention=True, xformers_att_config=cfg.encoder.xformers_att_config,
        )  # fmt: skip

    def forward(
        self,
        x: Tensor,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        carry: Carry = Carry(),
        depth: int = 1,
    ):
        """Returns ``(x, carry)``: the layer output and what it hands the next layer."""
        if attn_mask is not None:  # as fairseq: 1 = masked, as a large finite negative
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )
        x, _, carry = self._attention_sublayer(
            x, "self_attn", "encoder", carry, depth,
            key_padding_mask=encoder_padding_mask, need_weights=False, attn_mask=attn_mask,
        )  # fmt: skip
        return self._feed_forward(x), carry


class RealformerDecoderLayer(_Backbone, TransformerDecoderLayerBase):
    """fairseq's decoder layer (same sublayers and parameter names) with two carried score
    paths (self- and cross-attention) and ω.

    ``forward`` is replaced: it takes and returns what both paths carry and scales the residual.
    """

    def __init__(self, cfg, options, no_encoder_attn=False):
        self.options = options  # read by the build_* methods during fairseq's __init__
        super().__init__(cfg, no_encoder_attn)
        sublayers = [s for s in SUBLAYERS["decoder"] if not (no_encoder_attn and s == "encoder_attn")]
        self._init_backbone(cfg, "decoder", sublayers)
        if no_encoder_attn:
            self.encoder_attn_omega = None

    def sublayer_omegas(self):
        """ADMIN's ω in the order the sublayers run."""
        return [self.self_attn_omega, self.encoder_attn_omega, self.ffn_omega]

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return self._residual_attention(
            cfg, "decoder", embed_dim, cfg.decoder.attention_heads,
            partial(super().build_self_attention, embed_dim, cfg, add_bias_kv, add_zero_attn),
            add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn, self_attention=True,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )  # fmt: skip

    def build_encoder_attention(self, embed_dim, cfg):
        return self._residual_attention(
            cfg, "cross", embed_dim, cfg.decoder.attention_heads,
            partial(super().build_encoder_attention, embed_dim, cfg),
            kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim, encoder_decoder_attention=True,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )  # fmt: skip

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
        carry: Carry = Carry(),
        depth: int = 1,
    ):
        """Returns ``(x, attn, carry)``; attn as fairseq's decoder layer (cross-attention
        probabilities when asked for), carry what this layer hands the next."""
        need_attn = need_attn or need_head_weights
        x, _, carry = self._attention_sublayer(
            x, "self_attn", "decoder", carry, depth,
            key_padding_mask=self_attn_padding_mask, incremental_state=incremental_state,
            need_weights=False, attn_mask=self_attn_mask,
        )  # fmt: skip
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            x, attn, carry = self._attention_sublayer(
                x, "encoder_attn", "cross", carry, depth, key_value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn), need_head_weights=need_head_weights,
            )  # fmt: skip
        return self._feed_forward(x), attn, carry
