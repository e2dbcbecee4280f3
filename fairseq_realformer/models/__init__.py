"""Registers the ``realformer`` model and its named architectures with fairseq. May import only
``errors``, ``files``, ``modules`` and ``options``."""

# The model registers first, then its architectures.
# isort: off
from .realformer import RealformerDecoder, RealformerEncoder, RealformerModel  # noqa: F401
from . import archs  # noqa: F401
# isort: on
