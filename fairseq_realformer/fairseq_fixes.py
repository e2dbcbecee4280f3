"""Fixes for fairseq defects that silently change results; installed when the plugin is imported.

``batch_by_size`` drops the last batch when its size is not a multiple of
``--required-batch-size-multiple`` (default 8). fairseq-generate then translates only part of a
test set (e.g. 1000 of 1003 sentences) and reports BLEU on that part, and validation skips
sentences too (fairseq issues #5036, #5351; still in fairseq main). We keep that batch: its
size already respects --max-tokens/--batch-size, it is only not a multiple of 8.
"""
import functools

import numpy as np
from fairseq.data import data_utils


def _keep_last_batch(batch_by_size):
    @functools.wraps(batch_by_size)
    def batch_by_size_keeping_every_index(indices, *args, **kwargs):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = batch_by_size(indices, *args, **kwargs)
        covered = sum(len(b) for b in batches)
        # fairseq's batches split `indices` in order; what it dropped is the tail
        if covered < len(indices) and (covered == 0 or np.array_equal(np.concatenate(batches), indices[:covered])):
            batches = list(batches) + [indices[covered:]]
        return batches

    batch_by_size_keeping_every_index.__fixed_by_realformer__ = True
    return batch_by_size_keeping_every_index


def install() -> None:
    if not getattr(data_utils.batch_by_size, "__fixed_by_realformer__", False):
        data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)


install()
