"""Encoder and decoder layers on every backbone of ``backbones.BACKBONES``, carrying what each
attention path hands on.

A layer reads its backbone's entry (``backbones``) for how each residual sublayer joins its input
and branch, where its LayerNorms are, what it initialises and whether a stack-level stream runs
beside x; which sublayers it has, their LayerNorms and their score paths come from the
vocabulary table (``sublayers``); which backbone, which score paths and which running-mean mode
from the model's ``RealformerOptions``. Every attention sublayer takes what the previous layer on
its path carried and hands on its own, by the path's name (``Carry``): on a residual-attention
path through ``ResidualMultiheadAttention``; off the path through ``PlainMultiheadAttention``,
fairseq's own module (fused SDPA path included, so a path that is switched off costs nothing),
which carries nothing. Both answer ``Attended``.
"""

from collections import namedtuple
from typing import Dict, Optional

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from . import compiled
from .backbones import BACKBONES
from .hyper_connections import HyperConnection
from .residual_attention import Carried, PlainMultiheadAttention, ResidualMultiheadAttention
from .sublayers import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    FFN,
    PATHS,
    SUBLAYERS,
    Sublayer,
)

# What a layer hands the next besides x: what each attention path carries, one field per path of
# ``sublayers.PATHS`` (``carry.encoder``, ``carry.decoder``, ``carry.cross``; a path that carries
# nothing keeps ``Carried()``), and ``carry.stream``, the backbone's stack-level stream (ResiDual's
# d; None on the other backbones).
Carry = namedtuple("Carry", (*PATHS, "stream"), defaults=(*(Carried(),) * len(PATHS), None))
NOTHING_CARRIED = Carry()  # what a stack's first layer receives


def replaced(carry: Carry, **fields) -> Carry:
    """*carry* with *fields* replaced. Not ``carry._replace``: compiled (--compile-layers) under
    PyTorch 2.11's dynamo, ``_replace`` returns an empty tuple of the class (fixed by 2.13)."""
    return Carry(*[fields[name] if name in fields else getattr(carry, name) for name in Carry._fields])


@torch.no_grad()
def initialize_embeddings(options, cfg, embed_tokens: nn.Embedding, side: str) -> None:
    """What the backbone does to a stack's input embeddings at construction (T-Fixup scales
    them; the others keep fairseq's N(0, d^-1/2))."""
    init = BACKBONES[options.backbone].init_embeddings
    if init is not None:
        init(cfg, embed_tokens, side)


class _Backbone:
    """The residual wiring shared by encoder and decoder layers (a mixin over fairseq's layers,
    which build the sublayers; ``options`` must be set before their ``__init__`` runs)."""

    # Set on every layer of a stack during ADMIN's profiling pass (see admin.AdminProfiler).
    admin_profiler = None
    # the join's weight on a backbone without a trainable one (DeepNorm's α; 1.0 otherwise)
    residual_alpha = 1.0
    # training steps run the class's compiled forward (--compile-layers; ``compiled.runs_compiled``)
    compiles = False

    # The per-sublayer join weights (``Sublayer.parameter``), made by ``_init_backbone`` on the
    # backbones that have one: ADMIN's per-channel ω, ReZero's scalar α. Declared here (without a
    # class value, which would hide the registered parameter) so that their names can be found.
    self_attn_omega: nn.Parameter
    encoder_attn_omega: Optional[nn.Parameter]  # None in a decoder layer without cross-attention
    ffn_omega: nn.Parameter
    self_attn_resweight: nn.Parameter
    encoder_attn_resweight: nn.Parameter
    ffn_resweight: nn.Parameter
    # With --residual-streams N > 1, each sublayer's Hyper-Connection (``<sublayer>_hyper_connection``)
    self_attn_hyper_connection: HyperConnection
    encoder_attn_hyper_connection: HyperConnection
    ffn_hyper_connection: HyperConnection

    def _init_backbone(self, cfg, side: str, sublayers) -> None:
        """The backbone's parameters and initialisation, after fairseq built the *sublayers*:
        its per-sublayer weights (declared above), no LayerNorms for a backbone without them,
        then its own initialisation of the layer."""
        self.backbone = backbone = BACKBONES[self.options.backbone]
        # fairseq's activation checkpointing replaces forward with its own wrapper: that runs eager
        self.compiles = self.options.compile_layers and not cfg.checkpoint_activations
        weight = backbone.weight
        if weight is not None:
            layers = cfg.encoder.layers if side == "encoder" else cfg.decoder.layers
            shape = (self.embed_dim,) if weight.per_channel else (1,)
            value = weight.initial(self.options, layers, side)
            for sublayer in sublayers:
                setattr(self, sublayer.parameter(weight.name), nn.Parameter(torch.full(shape, float(value))))
        self.normalize_after = backbone.layer_norm == "after"
        if backbone.layer_norm is None:
            for sublayer in SUBLAYERS[side]:
                setattr(self, sublayer.layer_norm, None)
        if backbone.init_layer is not None:
            backbone.init_layer(self, cfg, side)
        self._init_hyper_connections(cfg, sublayers)

    def _init_hyper_connections(self, cfg, sublayers) -> None:
        """With n > 1 residual streams, a Hyper-Connection per sublayer; the k-th sublayer of the
        stack (k from 0, in the order they run) reads stream k mod n at first."""
        options = self.options
        if not options.hyper_connections:
            return
        for j, sublayer in enumerate(sublayers):
            connection = HyperConnection(
                options.residual_streams,
                self.embed_dim,
                index=self.index * len(sublayers) + j,
                mix=options.residual_streams_mix,
                dynamic=options.residual_streams_dynamic,
                sinkhorn_iterations=options.sinkhorn_iterations,
                export=cfg.export,
            )
            setattr(self, sublayer.parameter("hyper_connection"), connection)

    def _hyper_connection(self, sublayer: Sublayer) -> Optional[HyperConnection]:
        return getattr(self, sublayer.parameter("hyper_connection"), None)

    def __call__(self, *args, **kwargs):
        # overridden to route a training step through the compiled forward (``compiled``)
        if compiled.runs_compiled(self):
            return compiled.compiled_forward(type(self))(self, *args, **kwargs)
        return super().__call__(*args, **kwargs)

    def train(self, mode: bool = True):
        # overridden to log what compiling cost, once, when training first stops for validation
        if not mode and self.compiles:
            compiled.COMPILE_TIME.report()
        return super().train(mode)

    def sublayer_omegas(self):
        """ADMIN's ω in the order the sublayers run (None where a layer has none)."""
        return [getattr(self, sublayer.parameter("omega"), None) for sublayer in SUBLAYERS[self.side]]

    def _weight(self, sublayer: Sublayer):
        """The sublayer's join weight: trainable (ADMIN's ω, ReZero's α), else ``residual_alpha``."""
        weight = self.backbone.weight
        return getattr(self, sublayer.parameter(weight.name)) if weight is not None else self.residual_alpha

    def _build_attention(self, cfg, sublayer: Sublayer, embed_dim: int, heads: int, **kwargs):
        """The attention module of *sublayer*: ours where its path carries scores or values, else
        fairseq's own (``PlainMultiheadAttention``). Either is built with the arguments of
        fairseq's build method for that sublayer (*kwargs*, and the three it takes from *cfg* and
        the layer), so that its parameters and their initialisation are fairseq's."""
        options, path = self.options, sublayer.path
        kwargs.update(
            dropout=cfg.attention_dropout, q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size
        )
        if path not in options.paths | options.value_paths:
            return PlainMultiheadAttention(embed_dim, heads, **kwargs)
        value_mix = options.value_mix if path in options.value_paths else None
        return ResidualMultiheadAttention(
            embed_dim,
            heads,
            residual_scores=path in options.paths,
            running_mean=options.running_mean,
            value_mix=value_mix,
            value_gate=value_mix == "learned" and self.index > 0,  # layer 1's values are V_1 itself
            **kwargs,
        )

    def _pre(self, x: Tensor, sublayer: Sublayer, layer_norm: Optional[nn.Module]):
        """The branch's input, after the LayerNorm on a Pre-LN backbone, and what ``_post`` joins
        its output to: x itself, or with residual streams what the width connection hands on
        (x is then the streams, and the branch reads their mix)."""
        residual, hyper_connection = x, self._hyper_connection(sublayer)
        if hyper_connection is not None:
            x, residual = hyper_connection.width_connection(x)
        return (layer_norm(x) if self.normalize_before else x), residual

    def _post(self, x: Tensor, residual, sublayer: Sublayer, layer_norm: Optional[nn.Module], carry: Carry):
        """Dropout on the branch, the backbone's join with the residual, LayerNorm after it; the
        branch also joins the stack-level stream if the backbone has one. With residual streams
        (Pre-LN only), the depth connection writes the branch into them. Returns (x, carry)."""
        x = self.dropout_module(x)
        hyper_connection = self._hyper_connection(sublayer)
        if hyper_connection is not None:
            return hyper_connection.depth_connection(x, residual), carry
        if carry.stream is not None:
            carry = replaced(carry, stream=carry.stream + x)  # ResiDual: d ← d + f(x)
        weight = self._weight(sublayer)
        if self.admin_profiler is not None:
            self.admin_profiler(weight, residual, x)  # sets ω from this sublayer's statistics
        x = self.backbone.join(x, residual, weight)
        return (layer_norm(x) if self.normalize_after else x), carry

    def _attention_sublayer(
        self, x: Tensor, sublayer: Sublayer, carry: Carry, depth: int, key_value: Optional[Tensor] = None, **kwargs
    ):
        """One attention sublayer on its score path, pre → attend → post. Self-attention when
        *key_value* is None. Returns (x, attention weights if asked for, *carry* with what this
        path hands on)."""
        attention, layer_norm = getattr(self, sublayer.name), getattr(self, sublayer.layer_norm)
        x, residual = self._pre(x, sublayer, layer_norm)
        key_value = x if key_value is None else key_value
        x, weights, carried = attention(
            query=x, key=key_value, value=key_value, **kwargs, carried=getattr(carry, sublayer.path), depth=depth
        )
        carry = replaced(carry, **{sublayer.path: carried})
        x, carry = self._post(x, residual, sublayer, layer_norm, carry)
        return x, weights, carry

    def _feed_forward(self, x: Tensor, carry: Carry):
        layer_norm = getattr(self, FFN.layer_norm)
        x, residual = self._pre(x, FFN, layer_norm)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.fc2(x)
        return self._post(x, residual, FFN, layer_norm, carry)


class RealformerEncoderLayer(_Backbone, TransformerEncoderLayerBase):
    """fairseq's encoder layer (same sublayers and parameter names) with carried scores and ω.

    ``forward`` is replaced: it takes and returns what the score paths carry and scales the residual.
    """

    def __init__(self, cfg, options, index: int = 0):
        # read by build_self_attention during fairseq's __init__; index: the layer's, from 0
        self.options, self.side, self.index = options, "encoder", index
        super().__init__(cfg)
        self._init_backbone(cfg, "encoder", SUBLAYERS["encoder"])

    def build_self_attention(self, embed_dim, cfg):
        # fairseq's arguments (TransformerEncoderLayerBase.build_self_attention), our module
        return self._build_attention(
            cfg,
            ENCODER_SELF_ATTENTION,
            embed_dim,
            cfg.encoder.attention_heads,
            self_attention=True,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )

    def forward(
        self,
        x: Tensor,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        carry: Carry = NOTHING_CARRIED,
        depth: int = 1,
    ):
        """Returns ``(x, carry)``: the layer output and what it hands the next layer."""
        if attn_mask is not None:  # as fairseq: 1 = masked, as a large finite negative
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)
        x, _, carry = self._attention_sublayer(
            x,
            ENCODER_SELF_ATTENTION,
            carry,
            depth,
            key_padding_mask=encoder_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
        )
        return self._feed_forward(x, carry)


class RealformerDecoderLayer(_Backbone, TransformerDecoderLayerBase):
    """fairseq's decoder layer (same sublayers and parameter names) with two carried score
    paths (self- and cross-attention) and ω.

    ``forward`` is replaced: it takes and returns what both paths carry and scales the residual.
    """

    def __init__(self, cfg, options, no_encoder_attn=False, index: int = 0):
        # read by the build_* methods during fairseq's __init__; index: the layer's, from 0
        self.options, self.side, self.index = options, "decoder", index
        super().__init__(cfg, no_encoder_attn)
        sublayers = [s for s in SUBLAYERS["decoder"] if not (no_encoder_attn and s is CROSS_ATTENTION)]
        self._init_backbone(cfg, "decoder", sublayers)
        if no_encoder_attn:
            self.encoder_attn_omega = None

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        # fairseq's arguments (TransformerDecoderLayerBase.build_self_attention; self-attention
        # only: --cross-self-attention is refused by options), our module
        return self._build_attention(
            cfg,
            DECODER_SELF_ATTENTION,
            embed_dim,
            cfg.decoder.attention_heads,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=True,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        # fairseq's arguments (TransformerDecoderLayerBase.build_encoder_attention), our module
        return self._build_attention(
            cfg,
            CROSS_ATTENTION,
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            encoder_decoder_attention=True,
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
        carry: Carry = NOTHING_CARRIED,
        depth: int = 1,
    ):
        """Returns ``(x, attn, carry)``; attn as fairseq's decoder layer (cross-attention
        probabilities when asked for), carry what this layer hands the next."""
        need_attn = need_attn or need_head_weights
        x, _, carry = self._attention_sublayer(
            x,
            DECODER_SELF_ATTENTION,
            carry,
            depth,
            key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            attn_mask=self_attn_mask,
        )
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            x, attn, carry = self._attention_sublayer(
                x,
                CROSS_ATTENTION,
                carry,
                depth,
                key_value=encoder_out,
                key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state,
                static_kv=True,
                # only when asked (the alignment layer): fairseq's layer also computes every other
                # layer's weights in eval, which its decoder drops
                need_weights=need_attn,
                need_head_weights=need_head_weights,
            )
        x, carry = self._feed_forward(x, carry)
        return x, attn, carry
