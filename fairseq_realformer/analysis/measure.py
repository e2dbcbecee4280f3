"""Run a model teacher-forced over batches and measure the attention of its three paths."""

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional

import torch
from torch import nn

from ..options import PATHS
from .capture import AttentionRecorder
from .statistics import PathStatistics, path_masks


@dataclass
class ModelAttention:
    """What was measured on one model: statistics per path, and on how much data."""

    checkpoint: str
    label: str
    data: str  # DATA_BIN as given
    split: str
    sentences: int
    paths: Dict[str, PathStatistics]


def measure(
    model: nn.Module,
    batches: Iterable[dict],
    *,
    unit: str = "nats",
    sample_size: int = 5000,
    seed: int = 1,
    progress: Optional[Callable[[int], None]] = None,
) -> Dict[str, PathStatistics]:
    """Feed each batch's references to *model* (teacher forcing: ``sample["net_input"]`` with
    ``src_tokens``, ``src_lengths``, ``prev_output_tokens``) and accumulate, per path, every real
    query token's entropy and adjacent-layer JSD. *progress* is called with each batch's size.

    The model must be in eval mode (attention dropout would change the probabilities)."""
    if model.training:
        raise ValueError("measure() needs the model in eval mode")
    stats: Dict[str, PathStatistics] = {}
    recorder = AttentionRecorder(model, lambda path, layer, probabilities: stats[path].add_layer(layer, probabilities))
    generator = torch.Generator().manual_seed(seed)
    max_keys = max(_as_tuple(model.max_positions()))
    for path, modules in recorder.modules.items():
        stats[path] = PathStatistics(len(modules), modules[0].num_heads, max_keys, unit, sample_size, generator)
    src_pad, tgt_pad = model.encoder.padding_idx, model.decoder.padding_idx
    with torch.no_grad(), recorder:
        for batch in batches:
            net_input = batch["net_input"]
            masks = path_masks(net_input["src_tokens"], net_input["prev_output_tokens"], src_pad, tgt_pad)
            for path in PATHS:
                stats[path].start_batch(*masks[path])
            model(**net_input, features_only=True)  # the output projection is not needed
            for path in PATHS:
                stats[path].end_batch()
            if progress is not None:
                progress(len(net_input["src_tokens"]))
    return stats


def _as_tuple(max_positions):
    return max_positions if isinstance(max_positions, tuple) else (max_positions,)
