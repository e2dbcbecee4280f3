"""What the model needs from fairseq, installed once when the plugin is imported (``install``,
called by the package's ``__init__``). fairseq's own defects, which the plugin fixes for every
model (and ``REALFORMER_FAIRSEQ_FIXES=0`` leaves alone), are ``fixes``.

=====================  ================================  =====================================
change                 replaces                          why the model needs it
=====================  ================================  =====================================
checkpoint allow-list  checkpoint_utils                  fairseq checkpoints load under
                       .load_checkpoint_to_cpu,          torch.load(weights_only=True),
                       .load_ema_from_checkpoint         protection on; damaged files named
                                                         (``checkpoints.guarded``)
ADMIN after loading    checkpoint_utils.load_checkpoint  ADMIN's ω set from data in
                                                         fairseq-train before the optimizer
                                                         exists (``--admin-init profile``)
fast update            trainer.Trainer._build_optimizer  the optimizer step, gradient norm
                                                         and --fp16 copies as multi-tensor
                                                         ops, the same numbers (``fast_update``;
                                                         off with ``--fairseq-update``)
=====================  ================================  =====================================

Each replaces one attribute that fairseq's own callers look up at call time (``patching``).
Loaded, these change nothing for fairseq's own models: a stock ``transformer``'s checkpoints load
as they do with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, its ``load_checkpoint`` result comes back
as it is, and its optimizer is fairseq's.
"""

import functools
import types

import fairseq.utils
from fairseq import checkpoint_utils

from ..files import checkpoints
from ..models.realformer import RealformerModel
from ..modules import admin
from ..optim import fast_update
from .patching import patch


def install() -> None:
    """Install each change (idempotent: a second import of the plugin changes nothing)."""
    import fairseq.trainer  # the call sites' modules (cheap once fairseq is imported)
    import fairseq_cli.train
    from fairseq.models.ema import EMA

    # fairseq-generate, -interactive and the hub load through load_model_ensemble_and_task
    patch(
        checkpoint_utils,
        "load_checkpoint_to_cpu",
        checkpoints.guarded,
        call_sites=[fairseq.trainer.Trainer.load_checkpoint, checkpoint_utils.load_model_ensemble_and_task],
    )
    patch(checkpoint_utils, "load_ema_from_checkpoint", _guarded_ema_loader, call_sites=[EMA.__init__])
    patch(checkpoint_utils, "load_checkpoint", _initialize_admin_after_loading, call_sites=[fairseq_cli.train.main])
    patch(
        fairseq.trainer.Trainer, "_build_optimizer", _fast_update, call_sites=[fairseq.trainer.Trainer.optimizer.fget]
    )


def _guarded_ema_loader(load_ema_from_checkpoint):
    """``checkpoints.guarded`` for the EMA loader, whose caller (``EMA.__init__``) reads the
    parameters under 'model' (``checkpoints.holds_model``)."""
    return checkpoints.guarded(load_ema_from_checkpoint, needs=checkpoints.holds_model)


def _initialize_admin_after_loading(load_checkpoint):
    """Set ADMIN's ω from data (``--admin-init profile`` / ``--admin-init-path``) in
    fairseq-train right after it has loaded the checkpoint and the training data and before it
    builds the optimizer, so that every optimizer (also --fp16's float32 master copy of the
    parameters) starts from the initialised ω. A resumed run loads ω from its checkpoint, and
    nothing is pending.

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.load_checkpoint(cfg.checkpoint,
    trainer, ...)`` and gets ``(extra_state, epoch_itr)``. If fairseq stopped calling it there,
    the model's guard refuses the first training step with a message (never trains on unset ω).

    A stock ``transformer`` run: nothing. Only a ``RealformerModel`` is asked whether ω are
    pending; any other model is asked nothing, and fairseq's result comes back as it is, also
    with stand-in trainers and models (fairseq's own tests use ``MagicMock``)."""

    @functools.wraps(load_checkpoint)
    def load_checkpoint_then_initialize_admin(cfg, trainer, **kwargs):
        loaded = load_checkpoint(cfg, trainer, **kwargs)
        model = trainer.get_model()
        if not (isinstance(model, RealformerModel) and admin.pending(model)):
            return loaded  # any other model (or a test's stand-in), untouched and unasked
        extra_state, epoch_itr = loaded
        admin.initialize(model, _first_batch_of_this_rank(trainer, epoch_itr)["net_input"])
        return extra_state, epoch_itr

    return load_checkpoint_then_initialize_admin


def _fast_update(build_optimizer):
    """Give the optimizer fairseq-train builds for a plugin model the fast update
    (``fast_update.install``: one multi-tensor op per line of the optimizer's formula, the same
    numbers), unless ``--fairseq-update``.

    Call site: ``Trainer.optimizer`` builds the optimizer on first use (also before loading a
    checkpoint's optimizer state, which then loads into the fast one).

    A stock ``transformer`` run: nothing; only a ``RealformerModel``'s trainer is changed."""

    @functools.wraps(build_optimizer)
    def build_optimizer_with_fast_update(trainer):
        build_optimizer(trainer)
        model = trainer.get_model()
        if isinstance(model, RealformerModel) and model.options.fast_update:
            fast_update.install(trainer._optimizer)
            if fairseq.utils.xm is None:  # with torch_xla, fairseq seeds its generator too: fairseq's
                trainer._set_seed = types.MethodType(fast_update.seed_without_snapshot, trainer)

    return build_optimizer_with_fast_update


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
