"""Encoder and decoder layers on every backbone, carrying attention scores.

Backbones (one residual sublayer f: self-attention, cross-attention or FFN):

    post-ln   x ← LN(x + f(x))
    pre-ln    x ← x + f(LN(x))
    admin     x ← LN(x·ω + f(x)), ω a trainable per-channel vector per sublayer (ADMIN)
    deepnorm  x ← LN(α·x + f(x)), α fixed per stack; value/output/FFN weights scaled by β (DeepNet)

The residual wiring of every backbone is here (``_Backbone``); which backbone, which score paths
and which running-mean mode come from the model's ``RealformerOptions``. On a residual-attention
path a layer takes the previous layer's carried scores and returns its own (see
``residual_attention``); off the path it uses fairseq's own attention module, fused SDPA path
included, so a path that is switched off costs nothing.
"""
from functools import partial
from typing import Dict, Optional, Tuple

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from .admin import initial_omega
from .residual_attention import ResidualMultiheadAttention

# DeepNorm scales these projections by β at initialisation; queries and keys keep theirs
DEEPNORM_BETA_SCALED = ("fc1", "fc2", "v_proj", "out_proj")


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


def _attend(attention, prev_scores: Optional[Tensor], depth: int, **kwargs):
    """Call a residual or a plain fairseq attention module; both answer (x, weights, scores)."""
    if isinstance(attention, ResidualMultiheadAttention):
        return attention(**kwargs, prev_scores=prev_scores, depth=depth)
    x, weights = attention(**kwargs)
    return x, weights, None


class _Backbone:
    """The residual wiring shared by encoder and decoder layers (a mixin over fairseq's layers,
    which build the sublayers; ``options`` must be set before their ``__init__`` runs)."""

    # Set on every layer of a stack during ADMIN's profiling pass (see admin.AdminProfiler).
    admin_profiler = None
    # DeepNorm's α (1.0 on the other backbones)
    residual_alpha = 1.0

    def _omega(self, cfg, side: str) -> Optional[nn.Parameter]:
        if self.options.backbone != "admin":
            return None
        layers = cfg.encoder.layers if side == "encoder" else cfg.decoder.layers
        return nn.Parameter(torch.full((self.embed_dim,), initial_omega(self.options, layers, side)))

    def _init_backbone(self, cfg, side: str) -> None:
        """Initialisation the backbone adds after fairseq's (DeepNorm's α and β)."""
        if self.options.backbone == "deepnorm":
            self.residual_alpha, beta = deepnorm_alpha_beta(cfg.encoder.layers, cfg.decoder.layers, side)
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if name.split(".")[-2] in DEEPNORM_BETA_SCALED:
                        p.mul_(beta)

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

    def _pre(self, x: Tensor, layer_norm: nn.Module) -> Tensor:
        return layer_norm(x) if self.normalize_before else x

    def _post(self, x: Tensor, residual: Tensor, omega: Optional[Tensor], layer_norm: nn.Module):
        x = self.dropout_module(x)
        if omega is not None:
            if self.admin_profiler is not None:
                self.admin_profiler(omega, residual, x)  # sets ω from this sublayer's statistics
            x = torch.addcmul(x, residual, omega)
        elif self.residual_alpha != 1.0:
            x = torch.add(x, residual, alpha=self.residual_alpha)
        else:
            x = residual + x
        return x if self.normalize_before else layer_norm(x)

    def _attention_sublayer(self, x: Tensor, attention, layer_norm: nn.Module, omega: Optional[Tensor],
                            prev_scores: Optional[Tensor], depth: int, key_value: Optional[Tensor] = None,
                            **kwargs):  # fmt: skip
        """One attention sublayer, pre → attend → post. Self-attention when *key_value* is None.
        Returns (x, attention weights if asked for, the scores to carry on this path or None)."""
        residual = x
        x = self._pre(x, layer_norm)
        key_value = x if key_value is None else key_value
        x, weights, scores = _attend(attention, prev_scores, depth, query=x, key=key_value, value=key_value, **kwargs)
        return self._post(x, residual, omega, layer_norm), weights, scores

    def _feed_forward(self, x: Tensor) -> Tensor:
        residual = x
        x = self._pre(x, self.final_layer_norm)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.fc2(x)
        return self._post(x, residual, self.ffn_omega, self.final_layer_norm)


class RealformerEncoderLayer(_Backbone, TransformerEncoderLayerBase):
    """fairseq's encoder layer (same sublayers and parameter names) with carried scores and ω.

    ``forward`` is replaced: it takes and returns the carried scores and scales the residual.
    """

    def __init__(self, cfg, options):
        self.options = options  # read by build_self_attention during fairseq's __init__
        super().__init__(cfg)
        self.self_attn_omega = self._omega(cfg, "encoder")
        self.ffn_omega = self._omega(cfg, "encoder")
        self._init_backbone(cfg, "encoder")

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
        prev_scores: Optional[Tensor] = None,
        depth: int = 1,
    ):
        """Returns ``(x, scores)``: the layer output and the carried scores (None off the path)."""
        if attn_mask is not None:  # as fairseq: 1 = masked, as a large finite negative
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )
        x, _, scores = self._attention_sublayer(
            x, self.self_attn, self.self_attn_layer_norm, self.self_attn_omega, prev_scores, depth,
            key_padding_mask=encoder_padding_mask, need_weights=False, attn_mask=attn_mask,
        )  # fmt: skip
        return self._feed_forward(x), scores


class RealformerDecoderLayer(_Backbone, TransformerDecoderLayerBase):
    """fairseq's decoder layer (same sublayers and parameter names) with two carried score
    paths (self- and cross-attention) and ω.

    ``forward`` is replaced: it takes and returns both carried scores and scales the residual.
    """

    def __init__(self, cfg, options, no_encoder_attn=False):
        self.options = options  # read by the build_* methods during fairseq's __init__
        super().__init__(cfg, no_encoder_attn)
        self.self_attn_omega = self._omega(cfg, "decoder")
        self.encoder_attn_omega = None if no_encoder_attn else self._omega(cfg, "decoder")
        self.ffn_omega = self._omega(cfg, "decoder")
        self._init_backbone(cfg, "decoder")

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
        prev_self_scores: Optional[Tensor] = None,
        prev_cross_scores: Optional[Tensor] = None,
        depth: int = 1,
    ):
        """Returns ``(x, attn, self_scores, cross_scores)``; attn as fairseq's decoder layer
        (cross-attention probabilities when asked for), scores None off their path."""
        need_attn = need_attn or need_head_weights
        x, _, self_scores = self._attention_sublayer(
            x, self.self_attn, self.self_attn_layer_norm, self.self_attn_omega, prev_self_scores, depth,
            key_padding_mask=self_attn_padding_mask, incremental_state=incremental_state,
            need_weights=False, attn_mask=self_attn_mask,
        )  # fmt: skip
        attn = cross_scores = None
        if self.encoder_attn is not None and encoder_out is not None:
            x, attn, cross_scores = self._attention_sublayer(
                x, self.encoder_attn, self.encoder_attn_layer_norm, self.encoder_attn_omega, prev_cross_scores,
                depth, key_value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn), need_head_weights=need_head_weights,
            )  # fmt: skip
        return self._feed_forward(x), attn, self_scores, cross_scores
