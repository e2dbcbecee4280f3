"""Named architectures: each sets its defaults, then calls fairseq's architecture of the same
size, so flags given on the command line win and the numbers read as fairseq's, and ends by
checking every plugin flag (fairseq runs it while parsing: a mistake is refused before anything is
built or written). Depth comes from ``--encoder-layers/--decoder-layers`` (the paper's 6L-6L,
12L-12L, 18L-18L, 60L-12L)."""

from fairseq.models import register_model_architecture
from fairseq.models.transformer import (
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

from ..options import check, set_defaults


def _admin_baseline(args):
    """ADMIN without residual attention (the paper's main baseline)."""
    set_defaults(args, residual_attention_paths="none")


# RealFormer on ADMIN, residual attention on all three paths, running mean.
@register_model_architecture("realformer", "realformer_wmt_en_de")
def realformer_wmt_en_de(args):  # 512/2048/8 heads, dropout 0.1
    set_defaults(args)
    transformer_wmt_en_de(args)
    check(args)


@register_model_architecture("realformer", "realformer_wmt_en_fr")
def realformer_wmt_en_fr(args):  # the paper's En-Fr models have the base size too
    set_defaults(args)
    transformer_wmt_en_de(args)
    check(args)


@register_model_architecture("realformer", "realformer_wmt_en_de_big")
def realformer_wmt_en_de_big(args):  # 1024/4096/16 heads, dropout 0.3
    set_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)
    check(args)


@register_model_architecture("realformer", "realformer_iwslt_de_en")
def realformer_iwslt_de_en(args):  # 512/1024/4 heads: small data (IWSLT, Multi30k)
    set_defaults(args)
    transformer_iwslt_de_en(args)
    check(args)


# ADMIN baselines, no residual attention.
@register_model_architecture("realformer", "admin_wmt_en_de")
def admin_wmt_en_de(args):
    _admin_baseline(args)
    transformer_wmt_en_de(args)
    check(args)


@register_model_architecture("realformer", "admin_iwslt_de_en")
def admin_iwslt_de_en(args):
    _admin_baseline(args)
    transformer_iwslt_de_en(args)
    check(args)
