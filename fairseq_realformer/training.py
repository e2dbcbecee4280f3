"""What the plugin adds to fairseq-train: ADMIN's ω are set from data (``--admin-init profile`` or
``--admin-init-path``) right after fairseq loads the checkpoint and the training data, before it
builds the optimizer, so every optimizer (also --fp16's float32 master copy of the parameters)
starts from the initialised ω. A resumed run loads ω from its checkpoint and skips this.
"""
import functools

from fairseq import checkpoint_utils


def _first_batch_of_this_rank(trainer, epoch_itr):
    """A real training batch: this process's first batch of the epoch (one per rank, so that
    the ranks' statistics together cover different sentences)."""
    batches = getattr(epoch_itr, "frozen_batches", None)
    if batches and hasattr(epoch_itr, "collate_fn"):
        indices = batches[trainer.data_parallel_rank % len(batches)]
        sample = epoch_itr.collate_fn([epoch_itr.dataset[i] for i in indices])
    else:
        sample = epoch_itr.first_batch
    sample, _ = trainer._prepare_sample(sample)  # to the training device and dtype
    return sample


def _initialize_admin_after_loading(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def load_checkpoint_then_initialize_admin(cfg, trainer, **kwargs):
        extra_state, epoch_itr = load_checkpoint(cfg, trainer, **kwargs)
        model = trainer.get_model()
        if getattr(model, "admin_init_pending", False):
            model.initialize_admin(_first_batch_of_this_rank(trainer, epoch_itr)["net_input"])
        return extra_state, epoch_itr

    load_checkpoint_then_initialize_admin.__wrapped_by_realformer__ = True
    return load_checkpoint_then_initialize_admin


def install() -> None:
    if not getattr(checkpoint_utils.load_checkpoint, "__wrapped_by_realformer__", False):
        checkpoint_utils.load_checkpoint = _initialize_admin_after_loading(checkpoint_utils.load_checkpoint)


install()
