"""A resumed fairseq-train forgets how long its validation loss has not improved (``--patience``)."""

import functools

KEY = "patience"  # in a checkpoint's extra_state: {"best": ..., "num_runs": ...}


def _counter():
    import fairseq_cli.train

    return fairseq_cli.train.should_stop_early  # its state lives on the function itself


def save_patience(save_checkpoint):
    """``--patience N`` stops training after N validations without a better validation loss; fairseq
    counts them on the function ``should_stop_early`` (its attributes ``best`` and ``num_runs``),
    which no checkpoint saves. A resumed run starts counting again, and from the first loss it
    validates after the resume, even one worse than the best before: a run resumed every few
    epochs (a killed machine, a session that ends) may never stop early. We save the count with
    every checkpoint (``extra_state["patience"]``); ``resume_patience`` restores it. (No fairseq
    issue found.)

    Call site: ``checkpoint_utils.save_checkpoint`` calls ``trainer.save_checkpoint``, found on
    the trainer's class when it runs: no call site to check.

    A stock ``transformer`` run: one more small entry in every checkpoint's extra_state, only
    once a validation has counted (``--patience`` given)."""

    @functools.wraps(save_checkpoint)
    def save_checkpoint_with_patience(self, filename, extra_state):
        counter = _counter()
        if getattr(counter, "best", None) is not None:
            extra_state = {**extra_state, KEY: {"best": counter.best, "num_runs": counter.num_runs}}
        return save_checkpoint(self, filename, extra_state)

    return save_checkpoint_with_patience


def resume_patience(load_checkpoint):
    """The other half of ``save_patience``: a run resumed from a checkpoint that holds the count
    goes on counting from it, as if it had not stopped. Not when the checkpoint's meters or
    optimizer are reset (``--reset-meters``, ``--reset-optimizer``), where fairseq also forgets
    its best loss. A run killed after saving the checkpoint of the validation that exhausted its
    patience trains one more epoch when resumed, then stops.

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.load_checkpoint(cfg.checkpoint,
    trainer)``.

    A stock ``transformer`` run: the same as ``fairseq_cli.train``'s uninterrupted run."""

    @functools.wraps(load_checkpoint)
    def load_checkpoint_resuming_patience(cfg, *args, **kwargs):
        extra_state, epoch_itr = load_checkpoint(cfg, *args, **kwargs)
        saved = (extra_state or {}).get(KEY)
        if saved is not None and not (cfg.reset_optimizer or cfg.reset_meters):
            counter = _counter()
            counter.best, counter.num_runs = saved["best"], saved["num_runs"]
        return extra_state, epoch_itr

    return load_checkpoint_resuming_patience
