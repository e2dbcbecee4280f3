"""fairseq's batching: it drops the last batch of a split, and builds a resumed run's batches anew."""

import functools
import inspect
import logging

import numpy as np

logger = logging.getLogger(__name__)


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


def same_batches_after_resuming(get_batch_iterator):
    """A resumed fairseq-train run trains on other batches than the run it continues. fairseq
    (main, and ve-fairseq 0.12.3) sorts a training set's sentences by length, breaking ties with a
    permutation seeded by ``seed + epoch``, and cuts that order into batches once, when it builds
    the epoch iterator; every later epoch only shuffles those same batches. An uninterrupted run
    builds it at epoch 1. A run resumed at epoch k builds it at epoch k, so from there on sentences of
    equal length sit in other batches: the runs part at the first resumed update. Resumed mid-epoch
    (``--save-interval-updates``), the skipped batches are counted in the new batches, so the rest
    of that epoch repeats some sentences and never shows others. We build such an iterator as the
    uninterrupted run did (epoch 1), then set it and the dataset to the epoch asked for.

    Call site: ``Trainer.get_train_iterator`` calls ``task.get_batch_iterator``, found on the
    task's class when it runs (tasks that override it, such as translation_multi_simple_epoch, keep
    their own). Where fairseq builds batches each epoch anyway (``--rebuild-batches``, sharded data,
    datasets that cannot reuse an iterator), or the iterator is built at epoch 1 (every new run,
    validation, fairseq-generate), nothing changes.

    A stock ``transformer`` run: an uninterrupted run is unchanged; a resumed one now trains on
    exactly the uninterrupted run's batches, and with them its losses and checkpoints are the
    uninterrupted run's, bit for bit."""
    signature = inspect.signature(get_batch_iterator)

    @functools.wraps(get_batch_iterator)
    def get_batch_iterator_built_as_at_epoch_1(self, dataset, *args, **kwargs):
        asked = signature.bind(self, dataset, *args, **kwargs)
        asked.apply_defaults()
        options = asked.arguments
        epoch = options["epoch"]
        built_once_and_reused = (
            not getattr(getattr(self, "cfg", None), "rebuild_batches", False)
            and not options["disable_iterator_cache"]
            and not options.get("update_epoch_batch_itr", False)
            and self.can_reuse_epoch_itr(dataset)
        )
        if epoch <= 1 or not built_once_and_reused or dataset in self.dataset_to_epoch_iter:
            return get_batch_iterator(*asked.args, **asked.kwargs)
        options["epoch"] = 1
        logger.info(
            f"epoch {epoch}: the training batches are built as at epoch 1, as by the run this one "
            f"continues (fairseq_realformer: same_batches_after_resuming)"
        )
        iterator = get_batch_iterator(*asked.args, **asked.kwargs)
        iterator.epoch = epoch
        dataset.set_epoch(epoch)
        return iterator

    return get_batch_iterator_built_as_at_epoch_1
