"""Encoder and decoder layers on a Post-LN, Pre-LN or ADMIN backbone, carrying attention scores.

Backbones (one residual sublayer f: self-attention, cross-attention or FFN):

    post-ln   x ← LN(x + f(x))
    pre-ln    x ← x + f(LN(x))
    admin     x ← LN(x·ω + f(x)), ω a trainable per-channel vector per sublayer (ADMIN)
    deepnorm  x ← LN(α·x + f(x)), α fixed per stack; value/output/FFN weights scaled by β (DeepNet)

On a residual-attention path a layer takes the previous layer's carried scores and returns its
own (see ``residual_attention``); off the path it uses fairseq's own attention module, fused
SDPA path included, so a path that is switched off costs nothing.
"""
from typing import Dict, Optional

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ..config import residual_paths, running_mean
from . import deepnorm
from .admin import initial_omega
from .residual_attention import ResidualMultiheadAttention


def _attend(attention, prev_scores: Optional[Tensor], depth: int, **kwargs):
    """Call a residual or a plain fairseq attention module; both answer (x, weights, scores)."""
    if isinstance(attention, ResidualMultiheadAttention):
        return attention(**kwargs, prev_scores=prev_scores, depth=depth)
    x, weights = attention(**kwargs)
    return x, weights, None


class _Backbone:
    """The residual wiring shared by encoder and decoder layers (a mixin over fairseq's layers)."""

    # Set on every layer of a stack during ADMIN's profiling pass (see admin.AdminProfiler).
    admin_profiler = None
    # DeepNorm's α (1.0 on the other backbones)
    residual_alpha = 1.0

    def _init_backbone(self, cfg, side: str) -> None:
        if getattr(cfg, "backbone", "post-ln") == "deepnorm":
            self.residual_alpha, beta = deepnorm.alpha_beta(cfg.encoder.layers, cfg.decoder.layers, side)
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if name.split(".")[-2] in deepnorm.BETA_SCALED:
                        p.mul_(beta)

    def _omega(self, cfg, side: str) -> Optional[nn.Parameter]:
        if getattr(cfg, "backbone", "post-ln") != "admin":
            return None
        return nn.Parameter(torch.full((self.embed_dim,), initial_omega(cfg, side)))

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

    def __init__(self, cfg):
        super().__init__(cfg)
        self.self_attn_omega = self._omega(cfg, "encoder")
        self.ffn_omega = self._omega(cfg, "encoder")
        self._init_backbone(cfg, "encoder")

    def sublayer_omegas(self):
        """ADMIN's ω in the order the sublayers run."""
        return [self.self_attn_omega, self.ffn_omega]

    def build_self_attention(self, embed_dim, cfg):
        if "encoder" not in residual_paths(cfg):
            return super().build_self_attention(embed_dim, cfg)
        return ResidualMultiheadAttention(
            embed_dim,
            cfg.encoder.attention_heads,
            running_mean=running_mean(cfg),
            dropout=cfg.attention_dropout,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )

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
        residual = x
        x = self._pre(x, self.self_attn_layer_norm)
        x, _, scores = _attend(
            self.self_attn,
            prev_scores,
            depth,
            query=x,
            key=x,
            value=x,
            key_padding_mask=encoder_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
        )
        x = self._post(x, residual, self.self_attn_omega, self.self_attn_layer_norm)
        return self._feed_forward(x), scores


class RealformerDecoderLayer(_Backbone, TransformerDecoderLayerBase):
    """fairseq's decoder layer (same sublayers and parameter names) with two carried score
    paths (self- and cross-attention) and ω.

    ``forward`` is replaced: it takes and returns both carried scores and scales the residual.
    """

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn)
        self.self_attn_omega = self._omega(cfg, "decoder")
        self.encoder_attn_omega = None if no_encoder_attn else self._omega(cfg, "decoder")
        self.ffn_omega = self._omega(cfg, "decoder")
        self._init_backbone(cfg, "decoder")

    def sublayer_omegas(self):
        """ADMIN's ω in the order the sublayers run."""
        return [self.self_attn_omega, self.encoder_attn_omega, self.ffn_omega]

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if "decoder" not in residual_paths(cfg):
            return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)
        return ResidualMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            running_mean=running_mean(cfg),
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        if "cross" not in residual_paths(cfg):
            return super().build_encoder_attention(embed_dim, cfg)
        return ResidualMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            running_mean=running_mean(cfg),
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )

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
        residual = x
        x = self._pre(x, self.self_attn_layer_norm)
        x, _, self_scores = _attend(
            self.self_attn,
            prev_self_scores,
            depth,
            query=x,
            key=x,
            value=x,
            key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            attn_mask=self_attn_mask,
        )
        x = self._post(x, residual, self.self_attn_omega, self.self_attn_layer_norm)

        attn = cross_scores = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            x = self._pre(x, self.encoder_attn_layer_norm)
            x, attn, cross_scores = _attend(
                self.encoder_attn,
                prev_cross_scores,
                depth,
                query=x,
                key=encoder_out,
                value=encoder_out,
                key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state,
                static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )
            x = self._post(x, residual, self.encoder_attn_omega, self.encoder_attn_layer_norm)
        return self._feed_forward(x), attn, self_scores, cross_scores
