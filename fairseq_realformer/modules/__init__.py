from .layers import RealformerDecoderLayer, RealformerEncoderLayer  # noqa: F401
from .residual_attention import ResidualMultiheadAttention  # noqa: F401
