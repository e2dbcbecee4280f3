"""The ``realformer`` model: fairseq's Transformer with RealFormer residual attention on any of
its three score paths (encoder self-attention, decoder self-attention, encoder-decoder
attention), on a Post-LN, Pre-LN or ADMIN backbone.

With ``--residual-attention-paths none`` and ``--backbone post-ln`` (or ``pre-ln``) it is
fairseq's ``transformer``: same modules, same parameter names, same outputs.
"""
import logging
import os
from typing import Dict, List, Optional

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

from ..config import BACKBONES, MODES, PATHS, parse_paths
from ..errors import RealformerConfigError
from ..modules import admin
from ..modules.layers import RealformerDecoderLayer, RealformerEncoderLayer

logger = logging.getLogger(__name__)


def _wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, exactly as fairseq wraps its own layers."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class RealformerEncoder(TransformerEncoderBase):
    """fairseq's encoder whose layers carry the encoder self-attention scores.

    ``forward_scriptable`` is replaced to thread the scores from layer to layer.
    """

    def build_encoder_layer(self, cfg):
        return _wrap_layer(RealformerEncoderLayer(cfg), cfg)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(encoder_padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states = [x] if return_all_hiddens else []
        scores = None
        # depth counts the layers actually run, so LayerDrop keeps the running mean right
        for depth, layer in enumerate(self.layers, start=1):
            x, scores = layer(
                x,
                encoder_padding_mask=encoder_padding_mask if has_pads else None,
                prev_scores=scores,
                depth=depth,
            )
            if return_all_hiddens:
                encoder_states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)

        src_lengths = (
            src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        )
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

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(RealformerDecoderLayer(cfg, no_encoder_attn), cfg)

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
        self_attn_padding_mask = None
        if tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = tokens.eq(self.padding_idx)
        self_attn_mask = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        self_scores = cross_scores = None
        for idx, layer in enumerate(self.layers):
            x, layer_attn, self_scores, cross_scores = layer(
                x,
                enc,
                padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=idx == alignment_layer,
                need_head_weights=idx == alignment_layer,
                prev_self_scores=self_scores,
                prev_cross_scores=cross_scores,
                depth=idx + 1,
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads
        if self.layer_norm is not None:
            x = self.layer_norm(x)
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
    """RealFormer residual attention (He et al. 2021) on a Post-LN, Pre-LN or ADMIN Transformer.

    Subclassed from fairseq's (legacy, argparse) ``transformer`` for its flags, embeddings and
    generation interface; only the encoder, decoder and their layers differ.
    """

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        # no defaults here: the architectures set them, and command-line flags win
        parser.add_argument(
            "--residual-attention-paths",
            metavar="PATHS",
            help=f"score paths that carry residual attention: a comma list of "
            f"{', '.join(PATHS)}; or all / none",
        )
        parser.add_argument(
            "--residual-attention-mode",
            choices=MODES,
            help="sum: softmax over the running sum of scores S_n; mean: over S_n / n, "
            "n = attention layers traversed (the RealFormer paper's choice for NMT)",
        )
        parser.add_argument(
            "--backbone",
            choices=BACKBONES,
            help="post-ln: LN(x + f(x)); pre-ln: x + f(LN(x)); admin: LN(x*omega + f(x)) "
            "with a trainable per-channel omega (Liu et al. 2020); deepnorm: LN(alpha*x + f(x)) "
            "with DeepNet's alpha and beta-scaled initialisation (Wang et al. 2022)",
        )
        parser.add_argument(
            "--admin-init",
            choices=admin.ADMIN_INITS,
            help="how ADMIN's omega is initialised: closed-form: omega = sqrt((N+1)/ln(N+1) - 1), "
            "N = residual sublayers of the stack; profile: one forward pass on a training batch "
            "before the first update (the ADMIN paper's method; stored in the checkpoints)",
        )
        parser.add_argument(
            "--admin-init-path",
            metavar="FILE",
            help="initialise ADMIN's omega from a Transformer-Clinic profile.ratio.init "
            "before the first update (stored in the checkpoints; the file is not needed later)",
        )

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self._admin_pending = False
        if args.backbone == "admin" and admin.initialized_from_data(args):
            # 1 once ω are set from data; checkpoints carry it, so a resumed run never re-profiles
            self.register_buffer("admin_initialized", torch.zeros(()))
            self._admin_pending = True
            self.register_load_state_dict_post_hook(_refresh_admin_pending)

    @classmethod
    def build_model(cls, args, task):
        realformer_base_architecture(args)  # fill in what older checkpoints may lack
        check_args(args)
        return super().build_model(args, task)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, *args, **kwargs):
        if self._admin_pending and self.training:
            raise RealformerConfigError(
                "ADMIN's omega is not initialised yet (--admin-init profile / --admin-init-path): "
                "fairseq-train does it before the first update; in your own training loop call "
                "model.initialize_admin(sample['net_input']) before building the optimizer"
            )
        return super().forward(src_tokens, src_lengths, prev_output_tokens, *args, **kwargs)

    @property
    def admin_init_pending(self) -> bool:
        """ω still have to be set from data (--admin-init profile / --admin-init-path)."""
        return self._admin_pending

    @torch.no_grad()
    def initialize_admin(self, net_input: Optional[Dict[str, Tensor]] = None) -> None:
        """Set ADMIN's ω from data, once: from ``--admin-init-path``, or by one profiling pass on
        *net_input* (a training batch). In a distributed run every process must call it; they
        all end with the same ω. Build the optimizer afterwards: optimizers that keep their own
        copy of the parameters (fairseq's --fp16) would otherwise overwrite the new ω."""
        if not self._admin_pending:
            return
        stacks = (self.encoder.layers, self.decoder.layers)
        if self.args.admin_init_path:
            encoder_omegas, decoder_omegas = admin.load_clinic_profile(self.args.admin_init_path, *stacks)
            source = f"from {self.args.admin_init_path}"
        else:
            if net_input is None:
                raise ValueError("--admin-init profile needs a training batch (net_input)")
            src_tokens, src_lengths = net_input["src_tokens"], net_input["src_lengths"]
            prev_output_tokens = net_input["prev_output_tokens"]
            pad = self.encoder.padding_idx
            encoder_omegas, decoder_omegas = admin.profile(
                self,
                # fairseq's forward: ours refuses to train while ω are pending
                lambda: super(RealformerModel, self).forward(src_tokens, src_lengths, prev_output_tokens),
                stacks,
                keeps=(src_tokens.ne(pad).t(), prev_output_tokens.ne(pad).t()),
            )
            source = "by profiling one training batch per process"
        self.admin_initialized.fill_(1)
        self._admin_pending = False
        logger.info(
            f"ADMIN omega initialised {source}: encoder {encoder_omegas[0]:.3f} .. {encoder_omegas[-1]:.3f}, "
            f"decoder {decoder_omegas[0]:.3f} .. {decoder_omegas[-1]:.3f}"
        )

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return RealformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return RealformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


def _refresh_admin_pending(model, incompatible_keys) -> None:
    model._admin_pending = not bool(model.admin_initialized)


def check_args(args) -> None:
    """Refuse impossible flag combinations with a one-line message naming the flags, and derive
    the layer-norm placement from ``--backbone``."""
    paths = parse_paths(args.residual_attention_paths)
    admin_init_path = args.admin_init_path
    if args.admin_init == "profile" and admin_init_path:
        raise RealformerConfigError("--admin-init profile and --admin-init-path exclude each other")
    if args.backbone != "admin" and (args.admin_init == "profile" or admin_init_path):
        raise RealformerConfigError(
            f"--admin-init profile / --admin-init-path set ADMIN's omega, but --backbone is {args.backbone}"
        )
    if admin_init_path and os.path.exists(admin_init_path):
        # fail now rather than after loading the data; a missing file is only an error when
        # training starts (generation reads ω from the checkpoint and never needs the file)
        admin.read_clinic_profile(admin_init_path, args.encoder_layers, args.decoder_layers)
    if args.backbone not in BACKBONES:
        raise RealformerConfigError(f"--backbone must be one of {', '.join(BACKBONES)}")
    if args.residual_attention_mode not in MODES:
        raise RealformerConfigError(f"--residual-attention-mode must be one of {', '.join(MODES)}")
    if args.backbone == "pre-ln":
        args.encoder_normalize_before = args.decoder_normalize_before = True
    elif args.encoder_normalize_before or args.decoder_normalize_before:
        raise RealformerConfigError(
            f"--encoder-normalize-before/--decoder-normalize-before contradict --backbone "
            f"{args.backbone}; use --backbone pre-ln for a Pre-LN model"
        )
    if getattr(args, "cross_self_attention", False):
        raise RealformerConfigError(
            "--cross-self-attention is not supported by the realformer model: its decoder "
            "self-attention also attends over encoder states, which mixes the separate score paths"
        )
    if "cross" in paths and getattr(args, "no_cross_attention", False):
        raise RealformerConfigError(
            "--residual-attention-paths includes cross, but --no-cross-attention removes it"
        )
    if getattr(args, "base_layers", 0):
        raise RealformerConfigError("--base-layers is not supported by the realformer model")


def realformer_defaults(args) -> None:
    """The RealFormer paper's NMT setting: residual attention on all three paths, running mean,
    on an ADMIN backbone. Flags given on the command line win."""
    for name, default in (
        ("residual_attention_paths", "all"),
        ("residual_attention_mode", "mean"),
        ("backbone", "admin"),
        ("admin_init", "closed-form"),
        ("admin_init_path", None),
    ):
        if getattr(args, name, None) is None:
            setattr(args, name, default)


@register_model_architecture("realformer", "realformer")
def realformer_base_architecture(args):
    realformer_defaults(args)
    base_architecture(args)
