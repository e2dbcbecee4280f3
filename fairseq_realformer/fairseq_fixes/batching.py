"""fairseq's batching drops the last batch of a split."""

import functools

import numpy as np


def keep_last_batch(batch_by_size):
    """fairseq's ``batch_by_size`` drops the last batch when its size is not a multiple of
    ``--required-batch-size-multiple`` (default 8): fairseq-generate then translates and scores
    only part of a test set (e.g. 1000 of 1003 sentences), and validation skips sentences too
    (fairseq issues #5036, #5351; still in fairseq main). We keep that batch: its size already
    respects --max-tokens/--batch-size, it is only not a multiple of 8.

    Call site: ``FairseqDataset.batch_by_size`` (every dataset's batching) calls
    ``data_utils.batch_by_size``. If fairseq's batches stop being an in-order split of the
    indices, nothing is appended (the original's batches are returned as they are).

    A stock ``transformer`` run: fairseq's own batches, plus the tail fairseq dropped as one more
    batch. Where fairseq's batches already hold every sentence (e.g. with
    ``--required-batch-size-multiple 1``) nothing changes. Where it drops a tail, the difference
    is this fix, for every model alike: fairseq-generate translates every sentence, validation
    scores every sentence, and training also trains on the tail (fairseq drops the same longest
    sentences every epoch): one more update per epoch, so losses and checkpoints differ from
    fairseq's alone from the first epoch that had a dropped tail."""

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

    return batch_by_size_keeping_every_index
