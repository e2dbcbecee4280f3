"""ADMIN initialisation of ω (Liu et al. 2020, "Understanding the Difficulty of Training
Transformers"): each sublayer computes ``LN(x·ω + f(x))`` with a trainable per-channel ω, set at
initialisation so that no sublayer's output is dominated by its residual branch.

``closed-form`` (admin-torch): the same ω for every sublayer of a stack,
``ω = sqrt((N + 1) / ln(N + 1) − 1)``, N = number of residual sublayers in that stack
(2 per encoder layer: self-attention and FFN; 3 per decoder layer: self-attention,
cross-attention, FFN). E.g. N = 12 → 2.017, N = 36 → 3.041.
"""
import math

ADMIN_INITS = ("closed-form",)

ENCODER_SUBLAYERS_PER_LAYER = 2
DECODER_SUBLAYERS_PER_LAYER = 3


def closed_form_omega(num_sublayers: int) -> float:
    """ω for a stack of *num_sublayers* residual sublayers (admin-torch's closed form)."""
    if num_sublayers < 1:
        raise ValueError(f"a stack needs at least one residual sublayer, got {num_sublayers}")
    n = num_sublayers + 1
    return math.sqrt(n / math.log(n) - 1)


def initial_omega(cfg, side: str) -> float:
    """The starting ω of every sublayer on *side* ("encoder" or "decoder") of the model."""
    method = getattr(cfg, "admin_init", None) or "closed-form"
    if method != "closed-form":
        raise ValueError(f"unknown --admin-init {method!r}, expected one of {ADMIN_INITS}")
    if side == "encoder":
        return closed_form_omega(ENCODER_SUBLAYERS_PER_LAYER * cfg.encoder.layers)
    if side == "decoder":
        return closed_form_omega(DECODER_SUBLAYERS_PER_LAYER * cfg.decoder.layers)
    raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")
