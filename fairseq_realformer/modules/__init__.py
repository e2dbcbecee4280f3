"""The model's parts: residual attention, the backbones' layers and their residual paths (ADMIN,
Hyper-Connections, DenseFormer), the compiled layers. May import only ``errors``."""

from .layers import RealformerDecoderLayer, RealformerEncoderLayer  # noqa: F401
from .residual_attention import ResidualMultiheadAttention  # noqa: F401
