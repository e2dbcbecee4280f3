"""Print how many updates one epoch of a fairseq-train command line makes, so that train.sh can set
``--total-num-update`` (where polynomial_decay reaches 0) to exactly N epochs.

Usage: python updates_per_epoch.py FAIRSEQ-TRAIN-ARGUMENTS...

The training data are batched as fairseq-train batches them (Trainer.get_train_iterator: the same
task, --max-tokens/--batch-size, size filter, --required-batch-size-multiple and, with
--user-dir, the plugin's batching); the batches are split over --distributed-world-size ranks and
grouped by --update-freq. The number of batches is the same every epoch: fairseq forms them once
and only shuffles their order.
"""

import math
import sys

from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf


def updates_per_epoch(argv):
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, epoch=1, combine=True)
    # what the model accepts (Trainer asks the built model; these are the values it returns)
    model_positions = (
        getattr(cfg.model, "max_source_positions", None),
        getattr(cfg.model, "max_target_positions", None),
    )
    world_size = cfg.distributed_training.distributed_world_size
    epoch_itr = task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.train_subset),
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model_positions, cfg.dataset.max_tokens),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed,
        num_shards=world_size,
        shard_id=0,
        epoch=1,
        disable_iterator_cache=True,
    )
    batches_per_rank = len(epoch_itr)  # ceil(batches / world size): fairseq pads the shards
    update_freq = cfg.optimization.update_freq[0]
    rounding = math.floor if cfg.optimization.skip_remainder_batch else math.ceil
    return int(rounding(batches_per_rank / update_freq))


if __name__ == "__main__":
    print(updates_per_epoch(sys.argv[1:]))
