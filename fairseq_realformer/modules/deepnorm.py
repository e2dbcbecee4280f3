"""DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers") for an
encoder-decoder: ``x ← LN(α·x + f(x))`` with a fixed α, and the weights of the value, output
and FFN projections scaled by β at initialisation (as Microsoft's torchscale does).

For N encoder and M decoder layers:
    encoder  α = 0.81·(N⁴M)^(1/16),  β = 0.87·(N⁴M)^(−1/16)
    decoder  α = (3M)^(1/4),          β = (12M)^(−1/4)
"""
from typing import Tuple

# the projections β scales; query and key projections keep their initialisation
BETA_SCALED = ("fc1", "fc2", "v_proj", "out_proj")


def alpha_beta(encoder_layers: int, decoder_layers: int, side: str) -> Tuple[float, float]:
    n, m = encoder_layers, decoder_layers
    if side == "encoder":
        return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
    if side == "decoder":
        return (3 * m) ** (1 / 4), (12 * m) ** (-1 / 4)
    raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")
