"""The vocabulary of a layer's residual sublayers, in one table: which sublayers each side's
layers have, in the order they run, the LayerNorm attribute of each, and the score path each
attention sublayer is on.

The layers (``layers``), ADMIN (``admin``: ω per sublayer, the Clinic file's count), the flags
(``options.PATHS``), what a layer hands the next (``layers.Carry``, one field per path) and
``realformer-analyze`` (``analysis.capture``) read it from here. The names are fairseq's: the
attention sublayers are the fairseq layer's attributes ``self_attn`` and ``encoder_attn``, the
LayerNorms its ``*_layer_norm``; a per-sublayer parameter is named ``<sublayer>_<weight>``
(``ffn_omega``, ``encoder_attn_resweight``). These are state-dict names: checkpoints of every
earlier version load by them (``tests/test_compat.py``).
"""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Sublayer:
    """One residual sublayer of a layer."""

    name: str  # the fairseq layer's attribute for an attention sublayer; the prefix of its own parameters
    layer_norm: str  # the fairseq layer's attribute of its LayerNorm (before or after it, by backbone)
    path: Optional[str] = None  # the score path an attention sublayer is on; None: the FFN

    def parameter(self, weight: str) -> str:
        """The name of this sublayer's *weight* (``SublayerWeight.name``): ``ffn_omega``, ..."""
        return f"{self.name}_{weight}"


ENCODER_SELF_ATTENTION = Sublayer("self_attn", "self_attn_layer_norm", path="encoder")
DECODER_SELF_ATTENTION = Sublayer("self_attn", "self_attn_layer_norm", path="decoder")
CROSS_ATTENTION = Sublayer("encoder_attn", "encoder_attn_layer_norm", path="cross")
FFN = Sublayer("ffn", "final_layer_norm")

# The residual sublayers of a layer, by side, in the order they run.
SUBLAYERS: Dict[str, Tuple[Sublayer, ...]] = {
    "encoder": (ENCODER_SELF_ATTENTION, FFN),
    "decoder": (DECODER_SELF_ATTENTION, CROSS_ATTENTION, FFN),
}

# The three separate score paths of an encoder-decoder (RealFormer, Section 3 / NMT setup), in
# the order the table gives them: encoder, decoder, cross.
PATHS: Tuple[str, ...] = tuple(s.path for side in SUBLAYERS.values() for s in side if s.path is not None)

# Which side's layers each path's attention sublayers are in, and which sublayer it is.
ATTENTION_BY_PATH: Dict[str, Tuple[str, Sublayer]] = {
    s.path: (side, s) for side, sublayers in SUBLAYERS.items() for s in sublayers if s.path is not None
}


def per_layer(side: str) -> int:
    """Residual sublayers in one layer of *side* (2 in the encoder, 3 in the decoder)."""
    return len(SUBLAYERS[side])


def counts_per_layer() -> str:
    """ "2 per encoder layer, 3 per decoder layer", for messages."""
    return ", ".join(f"{per_layer(side)} per {side} layer" for side in SUBLAYERS)
