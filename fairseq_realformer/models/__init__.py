"""Registers the ``realformer`` model and its named architectures with fairseq."""
from . import archs, realformer  # noqa: F401
from .realformer import RealformerDecoder, RealformerEncoder, RealformerModel  # noqa: F401
