"""Registers the ``realformer`` model and its named architectures with fairseq."""
from .realformer import RealformerDecoder, RealformerEncoder, RealformerModel  # noqa: F401  (registers the model first)
from . import archs  # noqa: F401,E402  (then its architectures)
