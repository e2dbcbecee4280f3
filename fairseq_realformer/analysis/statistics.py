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


class MedianHistogram:
    """Counts of values in bins of width ``RESOLUTION`` centred on its multiples, per (row,
    head) of *shape*; values outside ``[0, upper]`` go to the end bins."""

    def __init__(self, shape: Tuple[int, int], upper: float):
        self.shape = shape
        self.bins = int(math.ceil(upper / RESOLUTION)) + 1
        self.counts = torch.zeros(*shape, self.bins, dtype=torch.int64)

    def add(self, values: Tensor) -> None:
        """*values* ``(rows, tokens, heads)``."""
        values = values.movedim(1, -1).reshape(-1, values.size(1)).cpu()  # (cells, tokens)
        index = torch.round(values / RESOLUTION).clamp(0, self.bins - 1).long()
        index += torch.arange(len(index)).unsqueeze(1) * self.bins
        counts = torch.bincount(index.flatten(), minlength=len(index) * self.bins)
        self.counts += counts.view(*self.shape, self.bins)

    def median(self, pool_heads: bool = False) -> Tensor:
        """Median of each (row, head), or of each row with its heads pooled."""
        counts = self.counts.sum(dim=-2) if pool_heads else self.counts
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
    """Entropy and adjacent-layer JSD of one path of one model, accumulated over batches.

    Per batch: ``start_batch`` with the batch's masks, ``add_layer`` with each layer's
    probabilities in order as the model runs them (only the previous layer's are kept, for the
    JSD), then ``end_batch``."""

    def __init__(self, layers: int, heads: int, max_keys: int, unit: str, sample_size: int, generator):
        self.layers, self.heads, self.unit = layers, heads, unit
        self.tokens = 0
        self.most_keys = 0  # the most keys a query token could see
        self.entropy = MedianHistogram((layers, heads), math.log(max_keys) / math.log(ENTROPY_UNITS[unit]))
        self.jsd = MedianHistogram((layers - 1, heads), 1.0)
        self.sample = TokenSample(sample_size, generator)
        self._batch = None

    def start_batch(self, queries: Tensor, visible: Tensor) -> None:
        """*queries* ``(B, T)``: the real query tokens; *visible* ``(B, T or 1, S)``: the keys
        each may attend to (see ``path_masks``)."""
        batch, length = queries.shape
        self._batch = {
            "queries": queries,
            "visible": visible.expand(batch, length, visible.size(-1))[queries].unsqueeze(1),  # (N, 1, S)
            "entropy": [],  # per layer (N, heads)
            "jsd": [],
            "previous": None,  # the previous layer's (N, heads, S)
        }
        self.most_keys = max(self.most_keys, int(visible.sum(dim=-1).max()))

    def add_layer(self, layer: int, probabilities: Tensor) -> None:
        """Layer *layer*'s (from 0) probabilities ``(heads, B, T, S)``."""
        batch = self._batch
        if layer != len(batch["entropy"]):
            raise RuntimeError(f"attention layer {layer + 1} ran after {len(batch['entropy'])} layers of its path")
        rows = probabilities.permute(1, 2, 0, 3)[batch["queries"]]  # (N, heads, S)
        batch["entropy"].append(entropy(rows, batch["visible"], self.unit))
        if batch["previous"] is not None:
            batch["jsd"].append(jensen_shannon(rows, batch["previous"], batch["visible"]))
        batch["previous"] = rows

    def end_batch(self) -> None:
        batch, self._batch = self._batch, None
        if len(batch["entropy"]) != self.layers:
            raise RuntimeError(f"{len(batch['entropy'])} of {self.layers} attention layers ran")
        entropies = torch.stack(batch["entropy"])  # (layers, N, heads)
        jsd = torch.stack(batch["jsd"]) if batch["jsd"] else entropies.new_zeros(0, *entropies.shape[1:])
        self.tokens += entropies.size(1)
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
