"""Per-token attention entropy and adjacent-layer Jensen-Shannon divergence, streamed.

For one query token, head and layer, with P its attention distribution over the keys it may see
(V: not padding; for decoder self-attention also not in the future):

    entropy  H(P) = -Σ_{k∈V} P_k log P_k                     in nats or bits (``unit``)
    JSD(P, Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M),  M = (P + Q) / 2  in bits, so 0 ≤ JSD ≤ 1

with Q the same token's distribution at the same head of the layer below (layer L−1), as in the
RealFormer paper's Fig. 6. ``0 log 0 = 0``.

Memory does not grow with the data: per (path, layer, head) a histogram of 0.001-wide bins gives
medians within ±0.0005 of the exact ones (every value is rounded to the nearest multiple of
0.001 before counting, which keeps the order of values), and one uniform random sample of query
tokens per path (the same tokens for every layer and head) feeds the violins.
"""
import math
from typing import List, Tuple

import torch
from torch import Tensor

ENTROPY_UNITS = {"nats": math.e, "bits": 2.0}
RESOLUTION = 1e-3  # histogram bin width, in the unit of the values: medians are exact to ±0.0005


def entropy(p: Tensor, visible: Tensor, unit: str = "nats") -> Tensor:
    """H(P) over the visible keys: *p* ``(..., keys)``, *visible* a bool mask broadcastable to it."""
    plogp = torch.where(visible, torch.special.xlogy(p, p), 0.0)
    return -plogp.sum(dim=-1) / math.log(ENTROPY_UNITS[unit])


def jensen_shannon(p: Tensor, q: Tensor, visible: Tensor) -> Tensor:
    """JSD(P, Q) in bits over the visible keys (clamped to [0, 1] against rounding)."""
    m = (p + q) / 2
    # as Σ p log(p/m), so that identical distributions give exactly 0
    kl_pm = torch.special.xlogy(p, p) - torch.special.xlogy(p, m)
    kl_qm = torch.special.xlogy(q, q) - torch.special.xlogy(q, m)
    jsd = torch.where(visible, kl_pm + kl_qm, 0.0).sum(dim=-1) / (2 * math.log(2))
    return jsd.clamp(0.0, 1.0)


def path_masks(src_tokens: Tensor, prev_output_tokens: Tensor, src_pad: int, tgt_pad: int):
    """For each path, ``(queries, visible)``: which query positions are real tokens ``(B, T)``,
    and which keys each query may attend to ``(B, T or 1, S)``.

    Works for left- or right-padded inputs: only the pad symbols and the order of positions count.
    """
    src_real, tgt_real = src_tokens.ne(src_pad), prev_output_tokens.ne(tgt_pad)
    length = prev_output_tokens.size(1)
    past = torch.ones(length, length, dtype=torch.bool, device=src_tokens.device).tril()
    return {
        "encoder": (src_real, src_real.unsqueeze(1)),
        "decoder": (tgt_real, tgt_real.unsqueeze(1) & past),
        "cross": (tgt_real, src_real.unsqueeze(1)),
    }


def token_measures(probabilities: List[Tensor], queries: Tensor, visible: Tensor, unit: str) -> Tuple[Tensor, Tensor]:
    """Entropy ``(layers, tokens, heads)`` and adjacent-layer JSD ``(layers - 1, tokens, heads)``
    of every real query token of a batch, from each layer's probabilities ``(heads, B, T, S)``."""
    batch, length = queries.shape
    visible = visible.expand(batch, length, visible.size(-1))[queries].unsqueeze(1)  # (N, 1, S)
    rows = [p.permute(1, 2, 0, 3)[queries] for p in probabilities]  # (N, heads, S) per layer
    entropies = torch.stack([entropy(r, visible, unit) for r in rows])
    heads = rows[0].size(1)
    jsd = [jensen_shannon(upper, lower, visible) for lower, upper in zip(rows, rows[1:])]
    jsd = torch.stack(jsd) if jsd else entropies.new_zeros(0, len(rows[0]), heads)
    return entropies, jsd


class MedianHistogram:
    """Counts of values in bins of width ``RESOLUTION`` centred on its multiples, per cell of
    *shape*; values outside ``[0, upper]`` go to the end bins."""

    def __init__(self, shape: Tuple[int, ...], upper: float):
        self.shape = shape
        self.bins = int(math.ceil(upper / RESOLUTION)) + 1
        self.counts = torch.zeros(*shape, self.bins, dtype=torch.int64)

    def add(self, values: Tensor) -> None:
        """*values* ``(*shape[:1], tokens, *shape[1:])`` as ``token_measures`` returns them."""
        values = values.movedim(1, -1).reshape(-1, values.size(1)).cpu()  # (cells, tokens)
        index = torch.round(values / RESOLUTION).clamp(0, self.bins - 1).long()
        index += torch.arange(len(index)).unsqueeze(1) * self.bins
        counts = torch.bincount(index.flatten(), minlength=len(index) * self.bins)
        self.counts += counts.view(*self.shape, self.bins)

    def median(self, pool_last_dim: bool = False) -> Tensor:
        """Median of each cell (or of each cell's row, its last dimension pooled)."""
        counts = self.counts.sum(dim=-2) if pool_last_dim else self.counts
        cumulative = counts.cumsum(dim=-1)
        total = cumulative[..., -1:]
        # 0-based ranks of the two middle values (equal for an odd count)
        ranks = torch.cat([(total - 1) // 2, total // 2], dim=-1)
        bins = torch.searchsorted(cumulative, ranks, right=True)
        return bins.double().mean(dim=-1) * RESOLUTION


class TokenSample:
    """A uniform random sample of at most *size* query tokens (bottom-k of random keys): the
    values of a sampled token are kept for every layer and head."""

    def __init__(self, size: int, generator: torch.Generator):
        self.size, self.generator = size, generator
        self.keys = torch.empty(0)
        self.values: List[Tensor] = []

    def add(self, *values: Tensor) -> None:
        """Each of *values* ``(layers, tokens, heads)``, the same tokens in the same order."""
        keys = torch.rand(values[0].size(1), generator=self.generator)
        keys = torch.cat([self.keys, keys])
        new = [v.cpu() for v in values]
        merged = [torch.cat([old, v], dim=1) for old, v in zip(self.values, new)] if self.values else new
        if len(keys) > self.size:
            keep = keys.topk(self.size, largest=False).indices
            keys, merged = keys[keep], [m[:, keep] for m in merged]
        self.keys, self.values = keys, merged


class PathStatistics:
    """Entropy and adjacent-layer JSD of one path of one model, accumulated over batches."""

    def __init__(self, layers: int, heads: int, max_keys: int, unit: str, sample_size: int, generator):
        self.layers, self.heads, self.unit = layers, heads, unit
        self.tokens = 0
        self.most_keys = 0  # the most keys a query token could see
        self.entropy = MedianHistogram((layers, heads), math.log(max_keys) / math.log(ENTROPY_UNITS[unit]))
        self.jsd = MedianHistogram((layers - 1, heads), 1.0)
        self.sample = TokenSample(sample_size, generator)

    def add(self, probabilities: List[Tensor], queries: Tensor, visible: Tensor) -> None:
        entropies, jsd = token_measures(probabilities, queries, visible, self.unit)
        self.tokens += entropies.size(1)
        self.most_keys = max(self.most_keys, int(visible.sum(dim=-1).max()))
        self.entropy.add(entropies)
        self.jsd.add(jsd)
        self.sample.add(entropies, jsd)

    @property
    def entropy_sample(self) -> Tensor:
        """``(layers, sampled tokens, heads)``"""
        return self.sample.values[0]

    @property
    def jsd_sample(self) -> Tensor:
        """``(layers - 1, sampled tokens, heads)``"""
        return self.sample.values[1]
