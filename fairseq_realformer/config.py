"""The plugin's options: residual-attention paths and modes, backbones (shared by layers and model)."""
from typing import FrozenSet

from .errors import RealformerConfigError

# The three separate score paths of an encoder-decoder (RealFormer, Section 3 / NMT setup).
PATHS = ("encoder", "decoder", "cross")
MODES = ("sum", "mean")
BACKBONES = ("post-ln", "pre-ln", "admin", "deepnorm")


def parse_paths(spec) -> FrozenSet[str]:
    """``--residual-attention-paths``: a comma list of encoder, decoder, cross; or all / none."""
    names = [s.strip() for s in str(spec if spec is not None else "none").split(",") if s.strip()]
    if names == ["all"]:
        return frozenset(PATHS)
    if names in ([], ["none"]):
        return frozenset()
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        raise RealformerConfigError(
            f"--residual-attention-paths: unknown path {', '.join(map(repr, unknown))}; "
            f"give a comma list of {', '.join(PATHS)}, or all, or none"
        )
    return frozenset(names)


def residual_paths(cfg) -> FrozenSet[str]:
    return parse_paths(getattr(cfg, "residual_attention_paths", None))


def running_mean(cfg) -> bool:
    return getattr(cfg, "residual_attention_mode", "sum") == "mean"
