"""The ``realformer`` model: fairseq's Transformer with RealFormer residual attention on any of
its three score paths (encoder self-attention, decoder self-attention, encoder-decoder
attention), on any backbone of ``modules.backbones.BACKBONES``.

With ``--residual-attention-paths none`` and ``--backbone post-ln`` (or ``pre-ln``) it is
fairseq's ``transformer``: same modules, same parameter names, same outputs.
"""

import logging
from contextvars import ContextVar
from typing import Dict, List, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from fairseq.modules import LayerNorm
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import options as plugin_options
from ..modules import admin, compiled
from ..modules.backbones import BACKBONES
from ..modules.dense_residual import DepthStates, DepthWeightedAverage
from ..modules.hyper_connections import collapse, widen
from ..modules.layers import Carry, RealformerDecoderLayer, RealformerEncoderLayer, initialize_embeddings

logger = logging.getLogger(__name__)

# The options of the model being built. fairseq's build_model calls build_encoder/build_decoder
# with a config it makes itself; the options reach them through this context, never through
# args (which checkpoints save, and which may be a hydra DictConfig).
_options_being_built: ContextVar[plugin_options.RealformerOptions] = ContextVar("realformer options")


def _wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq wraps its own layers."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = _checkpoint_activations(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def _checkpoint_activations(layer, offload_to_cpu: bool):
    """fairseq's ``checkpoint_wrapper`` around *layer*, with its arguments and results
    flattened: that wrapper passes gradients only through tensors given or returned at the top
    level, and a layer takes and returns the ``Carry`` structure."""
    structured_forward, results = layer.forward, {}

    def flat_forward(spec, *leaves):
        args, kwargs = tree_unflatten(list(leaves), spec)
        out_leaves, results["spec"] = tree_flatten(structured_forward(*args, **kwargs))
        return tuple(out_leaves)

    layer.forward = flat_forward
    checkpointed = checkpoint_wrapper(layer, offload_to_cpu=offload_to_cpu).forward

    def forward(*args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        return tree_unflatten(list(checkpointed(spec, *leaves)), results["spec"])

    layer.forward = forward
    return layer


def _build_stack_stream_layer_norm(stack, cfg, options) -> None:
    """The LayerNorm a stack-level stream is normalised with at the stack's output (ResiDual);
    fairseq builds ``layer_norm`` only for Pre-LN."""
    stream = BACKBONES[options.backbone].stack_stream
    if stream is not None:
        stack.layer_norm = LayerNorm(stack.embed_tokens.embedding_dim, eps=stream.layer_norm_eps, export=cfg.export)


def _build_dense_residual(stack, layers: int, options) -> None:
    """The stack's depth-weighted averages (DenseFormer; ``dense_residual`` None without them)."""
    stack.dense_residual = (
        DepthWeightedAverage(layers, options.dense_dilation, options.dense_period) if options.dense_averages else None
    )


def _start_dense_states(stack, x: Tensor) -> Optional[DepthStates]:
    """Every layer's output kept for the averages, from the embedded input *x* (None without)."""
    return stack.dense_residual.start(x) if stack.dense_residual is not None else None


def _start_carry(x: Tensor, options) -> Carry:
    """Nothing carried on any path yet; the backbone's stack-level stream starts from the
    embedded input *x* (ResiDual)."""
    return Carry(stream=x if BACKBONES[options.backbone].stack_stream is not None else None)


def _start_streams(x: Tensor, options) -> Tensor:
    """What the first layer takes: the embedded input *x*, or n copies of it as residual streams
    (Hyper-Connections)."""
    return widen(x, options.residual_streams) if options.hyper_connections else x


def _hidden_state(x: Tensor, options) -> Tensor:
    """A layer's output as the stack reports it (``encoder_states``, ``inner_states``): x, or the
    sum of the residual streams (the stack's output before its LayerNorm)."""
    return collapse(x) if options.hyper_connections else x


def _stack_output(stack, x: Tensor, carry: Carry) -> Tensor:
    """x + LN(d) with a stack-level stream (ResiDual), LN(x) where fairseq built the stack's
    LayerNorm (Pre-LN; LN of the streams' sum with residual streams), else x."""
    if carry.stream is not None:
        return x + stack.layer_norm(carry.stream)
    x = _hidden_state(x, stack.options)
    return stack.layer_norm(x) if stack.layer_norm is not None else x


class RealformerEncoder(TransformerEncoderBase):
    """fairseq's encoder whose layers carry the encoder self-attention scores.

    ``forward_scriptable`` is replaced to thread the scores from layer to layer.
    """

    def __init__(self, cfg, dictionary, embed_tokens, options):
        self.options = options  # read by build_encoder_layer during fairseq's __init__
        super().__init__(cfg, dictionary, embed_tokens)
        _build_stack_stream_layer_norm(self, cfg, options)
        _build_dense_residual(self, cfg.encoder.layers, options)
        initialize_embeddings(options, cfg, self.embed_tokens, "encoder")

    def build_encoder_layer(self, cfg):
        index = self._layers_built = getattr(self, "_layers_built", -1) + 1  # fairseq builds them in order
        return _wrap_layer(RealformerEncoderLayer(cfg, self.options, index), cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        # compiled layers always take the mask: one graph for both, and no host sync to learn which
        has_pads = compiled.stack_runs_compiled(self.layers) or bool(encoder_padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states = [x] if return_all_hiddens else []
        carry = _start_carry(x, self.options)
        x = _start_streams(x, self.options)
        dense = _start_dense_states(self, x)
        # depth counts the layers actually run, so LayerDrop keeps the running mean right
        for depth, layer in enumerate(self.layers, start=1):
            if dense is not None:
                x = dense.skip_to(layer.index, x)
            x, carry = layer(
                x,
                encoder_padding_mask=encoder_padding_mask if has_pads else None,
                carry=carry,
                depth=depth,
            )
            if dense is not None:
                x = dense.after(layer.index, x)
            if return_all_hiddens:
                encoder_states.append(_hidden_state(x, self.options))
        if dense is not None:
            x = dense.skip_to(len(self.layers), x)
        x = _stack_output(self, x, carry)

        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }


class RealformerDecoder(TransformerDecoderBase):
    """fairseq's decoder whose layers carry the decoder self-attention and the cross-attention
    scores, each on its own path.

    ``extract_features_scriptable`` is replaced to thread both from layer to layer.
    """

    def __init__(self, cfg, dictionary, embed_tokens, options, no_encoder_attn=False):
        self.options = options  # read by build_decoder_layer during fairseq's __init__
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        _build_stack_stream_layer_norm(self, cfg, options)
        _build_dense_residual(self, cfg.decoder.layers, options)
        initialize_embeddings(options, cfg, self.embed_tokens, "decoder")

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        index = self._layers_built = getattr(self, "_layers_built", -1) + 1  # fairseq builds them in order
        return _wrap_layer(RealformerDecoderLayer(cfg, self.options, no_encoder_attn, index), cfg)

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        x, tokens = self._embed_targets(prev_output_tokens, incremental_state)
        runs_compiled = compiled.stack_runs_compiled(self.layers)
        padding = tokens.eq(self.padding_idx)
        # compiled layers always take the mask (as the encoder's)
        self_attn_padding_mask = padding if runs_compiled or padding.any() else None
        self_attn_mask = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)
            if runs_compiled:  # a view of a buffer that grows: its stride would be a guard
                self_attn_mask = self_attn_mask.clone()

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        carry = _start_carry(x, self.options)
        x = _start_streams(x, self.options)
        dense = _start_dense_states(self, x)
        for idx, layer in enumerate(self.layers):
            if dense is not None:
                x = dense.skip_to(layer.index, x)
            x, layer_attn, carry = layer(
                x,
                enc,
                padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=idx == alignment_layer,
                need_head_weights=idx == alignment_layer,
                carry=carry,
                depth=idx + 1,
            )
            if dense is not None:
                x = dense.after(layer.index, x)
            inner_states.append(_hidden_state(x, self.options))
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads
        if dense is not None:
            x = dense.skip_to(len(self.layers), x)
        x = _stack_output(self, x, carry)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

    def _embed_targets(self, prev_output_tokens, incremental_state):
        """Token + position embeddings as fairseq's decoder computes them (T x B x C), and the
        tokens this step feeds (only the last one when decoding incrementally)."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        prev_output_tokens = prev_output_tokens.contiguous()
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        return x.transpose(0, 1), prev_output_tokens


@register_model("realformer")
class RealformerModel(TransformerModel):
    """RealFormer residual attention (He et al. 2021) on a Transformer of any backbone (Post-LN,
    Pre-LN, ADMIN, DeepNorm, ReZero, T-Fixup, ResiDual), with Hyper-Connections' residual streams
    or DenseFormer's depth-weighted averages where they are defined.

    Subclassed from fairseq's (legacy, argparse) ``transformer`` for its flags, embeddings and
    generation interface; only the encoder, decoder and their layers differ.
    """

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        plugin_options.add_args(parser)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.options = encoder.options
        admin.attach(self, self.options)

    @classmethod
    def build_model(cls, args, task):
        realformer_base_architecture(args)  # what older checkpoints lack gets today's defaults
        options = plugin_options.RealformerOptions.from_args(args)
        if options.compile_layers and getattr(args, "checkpoint_activations", False):
            logger.warning(
                "--compile-layers: the layers run eager under --checkpoint-activations "
                "(fairseq's checkpoint wrapper replaces their forward)"
            )
        token = _options_being_built.set(options)
        try:
            return super().build_model(args, task)
        finally:
            _options_being_built.reset(token)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        options = _options_being_built.get()
        cfg.encoder.normalize_before = options.normalize_before  # fairseq's layers read it
        return RealformerEncoder(cfg, src_dict, embed_tokens, options)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        options = _options_being_built.get()
        cfg.decoder.normalize_before = options.normalize_before
        return RealformerDecoder(cfg, tgt_dict, embed_tokens, options, no_encoder_attn=cfg.no_cross_attention)

    def initialize_admin(self, net_input: Optional[Dict[str, Tensor]] = None) -> None:
        """Set ADMIN's ω from data before building the optimizer (see ``admin.initialize``)."""
        admin.initialize(self, net_input)


@register_model_architecture("realformer", "realformer")
def realformer_base_architecture(args):
    plugin_options.set_defaults(args)
    base_architecture(args)
    plugin_options.check(args)
