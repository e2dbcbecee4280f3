"""Every change the plugin makes inside fairseq, installed once when the plugin is imported
(``install``, called by the package's ``__init__``).

Each patch replaces one attribute that fairseq's own callers look up at call time, wrapping the
original. ``_patch`` installs it once (one marker) and first checks that the callers it names
still look the attribute up there: if a fairseq release calls it another way, importing the
plugin fails with a message saying which patch no longer applies, instead of the patch silently
doing nothing.

=====================  ================================  =====================================
patch                  replaces                          for
=====================  ================================  =====================================
keep the last batch    data_utils.batch_by_size          fairseq #5036: generate/validate
                                                         drop sentences
checkpoint allow-list  checkpoint_utils                  torch.load(weights_only=True) of
                       .load_checkpoint_to_cpu,          fairseq checkpoints, protection on;
                       .load_ema_from_checkpoint         damaged files named (checkpoints.py)
missing checkpoints    checkpoint_utils                  fairseq-generate/-interactive, the
                       .load_model_ensemble_and_task,    hub: a missing file or folder named
                       hub_utils.from_pretrained         in one line
fairseq-train's start  checkpoint_utils.load_checkpoint  a --restore-file or
                                                         --finetune-from-model that does not
                                                         exist; ADMIN's ω from data before
                                                         the optimizer exists (our models);
                                                         wall=0 after a resume (a fairseq
                                                         defect)
half precision         Trainer.__init__                  --fp16/--amp without a GPU: one
                                                         line, not a deep traceback; --bf16:
                                                         bfloat16 mixed precision (precision.py)
bf16 without a TPU     distributed_utils.call_main       --bf16 without torch_xla does not turn
                                                         on fairseq's TPU run
bf16 translation       fairseq_cli.generate.main,        --bf16 translates in bfloat16 mixed
                       fairseq_cli.interactive.main,     precision, not silently in float32
                       GeneratorHubInterface.generate
one-line errors        sys.excepthook                    RealformerConfigError, and fairseq's
                                                         --fp16 with --bf16, as one line
no empty save dir      checkpoint_utils                  fairseq-train refused by the plugin
                       .verify_checkpoint_directory      after it made its save dir: taken
                                                         back when still empty
=====================  ================================  =====================================

Loaded, the plugin is meant to change nothing for fairseq's own models: each patch's docstring
says what it does to a stock ``transformer`` run. Three differences are deliberate and apply to
every model alike: the batching fix (a tail fairseq drops is kept), a ``--restore-file`` that does
not exist (refused, where fairseq trains from scratch), and ``--amp`` or
``--memory-efficient-fp16`` without a GPU (refused, where fairseq trains in float32 or emulated
float16). ``--bf16`` without torch_xla, which fairseq cannot run, is bfloat16 mixed precision
(``precision``). Everything else only turns a failure into a one-line message.
"""
import argparse
import functools
import inspect
import os
import sys
from types import FunctionType, ModuleType
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils, hub_utils
from fairseq import utils as fairseq_utils
from fairseq.data import data_utils
from fairseq.data.fairseq_dataset import FairseqDataset
from fairseq.file_io import PathManager
from fairseq.modules.fairseq_dropout import FairseqDropout

from . import checkpoints, folders, precision
from .errors import RealformerConfigError
from .models.realformer import RealformerModel
from .modules import admin

MARKER = "__patched_by_realformer__"


def install() -> None:
    """Install every patch (idempotent: a second import of the plugin changes nothing)."""
    import fairseq.trainer  # the call sites' modules (cheap once fairseq is imported)
    import fairseq_cli.generate
    import fairseq_cli.interactive
    import fairseq_cli.train
    from fairseq.distributed import utils as distributed_utils
    from fairseq.models import BaseFairseqModel, FairseqDecoder
    from fairseq.models.ema import EMA

    _patch(data_utils, "batch_by_size", _keep_last_batch, call_sites=[FairseqDataset.batch_by_size])
    # fairseq-generate, -interactive and the hub load through load_model_ensemble_and_task
    _patch(checkpoint_utils, "load_checkpoint_to_cpu", checkpoints.guarded,
           call_sites=[fairseq.trainer.Trainer.load_checkpoint, checkpoint_utils.load_model_ensemble_and_task])  # fmt: skip
    _patch(checkpoint_utils, "load_ema_from_checkpoint", lambda load: checkpoints.guarded(load, needs=checkpoints.holds_model),
           call_sites=[EMA.__init__])  # fmt: skip
    _patch(checkpoint_utils, "load_model_ensemble_and_task", _name_missing_checkpoints,
           call_sites=[checkpoint_utils.load_model_ensemble, hub_utils.from_pretrained])  # fmt: skip
    _patch(hub_utils, "from_pretrained", _name_missing_folders, call_sites=[BaseFairseqModel.from_pretrained])
    _patch(checkpoint_utils, "load_checkpoint", _start_training, call_sites=[fairseq_cli.train.main])
    _patch(fairseq.trainer.Trainer, "__init__", _check_precision, call_sites=[fairseq_cli.train.main])
    _patch(distributed_utils, "call_main", _bf16_without_tpu,
           call_sites=[fairseq_cli.train.cli_main, fairseq_cli.interactive.cli_main])  # fmt: skip
    for cli in (fairseq_cli.generate, fairseq_cli.interactive):
        _patch(cli, "main", _translate_in_bf16, call_sites=[cli.cli_main])
    _patch(FairseqDropout, "forward", _fast_dropout_in_bf16)  # nn.Module.__call__ looks forward up
    _patch(fairseq_utils, "log_softmax", _log_softmax_from_bf16, call_sites=[FairseqDecoder.get_normalized_probs_scriptable])
    _patch(hub_utils.GeneratorHubInterface, "generate", _hub_generates_in_bf16,
           call_sites=[hub_utils.GeneratorHubInterface.sample])  # fmt: skip
    _patch(checkpoint_utils, "verify_checkpoint_directory", _remember_new_save_dir, call_sites=[fairseq_cli.train.main])
    _patch(sys, "excepthook", _one_line_errors)  # the interpreter calls it: no call site to check


def _patch(owner: Union[ModuleType, type], name: str, wrap: Callable[[Callable], Callable],
           call_sites: Sequence[FunctionType] = ()):  # fmt: skip
    """Replace ``owner.name`` by ``wrap(owner.name)``, once. Each function of *call_sites* must
    look ``name`` up on *owner* when it runs (``owner_alias.name(...)``; ``name(...)`` inside
    *owner* itself; ``from package import owner`` inside the function; or, for a class's
    ``__init__``, calling the class), or the replacement would never be called there: that
    raises ImportError."""
    original = getattr(owner, name, None)
    if original is None:
        raise ImportError(f"fairseq_realformer: {owner.__name__}.{name} no longer exists in this fairseq; "
                          f"the plugin's patch of it cannot be installed")  # fmt: skip
    for site in call_sites:
        site = getattr(site, "__wrapped__", site)
        code, short_name = site.__code__, owner.__name__.rpartition(".")[2]
        looked_up_on_owner = (site.__globals__ is vars(owner) or any(v is owner for v in site.__globals__.values())
                              or short_name in code.co_varnames and short_name in code.co_names)  # fmt: skip
        called = short_name if isinstance(owner, type) and name == "__init__" else name
        if not (looked_up_on_owner and called in code.co_names):
            raise ImportError(f"fairseq_realformer: {site.__module__}.{site.__qualname__} no longer calls "
                              f"{owner.__name__}.{name}; the plugin's patch of it would never run there")  # fmt: skip
    if getattr(original, MARKER, False):
        return
    replacement = wrap(original)
    setattr(replacement, MARKER, True)
    setattr(owner, name, replacement)


def _keep_last_batch(batch_by_size):
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


def _start_training(load_checkpoint):
    """fairseq-train's start: the checkpoint files it is told to start from are named when
    missing, then ADMIN's ω are set from data, and a resumed run's wall clock runs again (each
    step below)."""
    return _restart_wall_clock(
        _initialize_admin_after_loading(_refuse_missing_restore_file(_name_missing_finetune_model(load_checkpoint)))
    )


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


def _restart_wall_clock(load_checkpoint):
    """A resumed fairseq-train logs ``wall=0`` on every line, a defect of fairseq itself: its
    "wall" meter is a ``StopwatchMeter`` (``metrics.log_start_time("wall")`` in
    ``Trainer.__init__``, never stopped), and ``Trainer.load_checkpoint`` loads the checkpoint's
    meters, which leaves it stopped (``start_time`` None: elapsed time 0). Right after, fairseq
    restarts only its ``TimeMeter``s ("since their start times don't make sense anymore"), the
    kind "wall" was in older fairseq. Restart the stopped wall clock the same way: after a resume,
    ``wall`` counts the seconds since the checkpoint was loaded, as it counts from the start of a
    fresh run. A wall clock that runs (a fresh run, any other meter) is left alone.

    A stock ``transformer`` run: the same; only the ``wall`` column of a resumed run's log
    changes (it counts again instead of reading 0).

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.load_checkpoint(cfg.checkpoint,
    trainer)``, which calls ``trainer.load_checkpoint``."""
    from fairseq.logging import meters, metrics

    @functools.wraps(load_checkpoint)
    def load_checkpoint_restarting_the_wall_clock(*args, **kwargs):
        loaded = load_checkpoint(*args, **kwargs)
        wall = metrics.get_meter("default", "wall")
        if isinstance(wall, meters.StopwatchMeter) and wall.start_time is None:
            wall.start()
        return loaded

    return load_checkpoint_restarting_the_wall_clock


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


def _name_missing_checkpoints(load_model_ensemble_and_task):
    """fairseq-generate, fairseq-interactive and the hub stop on a checkpoint path that does not
    exist with a traceback (``OSError: Model file not found``). Name the file in one line instead
    (a damaged file is named by the loader: ``checkpoints.guarded``).

    Call site: ``checkpoint_utils.load_model_ensemble`` (fairseq-generate, fairseq-interactive)
    and ``hub_utils.from_pretrained`` call it with the checkpoint paths; each shard's file name is
    fairseq's own ``get_maybe_sharded_checkpoint_filename``. If fairseq renamed these arguments,
    nothing is checked here and fairseq's own check (a traceback) runs as before.

    A stock ``transformer`` run: files that exist load as before (the check only asks
    ``PathManager.exists``, as fairseq does next); a missing one fails as before, with a
    ``MissingCheckpointError`` (still an ``OSError``) naming it."""
    signature = inspect.signature(load_model_ensemble_and_task)

    @functools.wraps(load_model_ensemble_and_task)
    def load_naming_missing_checkpoints(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        filenames, suffix, num_shards = (call.arguments.get(k, d) for k, d in (("filenames", []), ("suffix", ""), ("num_shards", 1)))  # fmt: skip
        for filename in filenames:
            for shard in range(num_shards):
                path = checkpoint_utils.get_maybe_sharded_checkpoint_filename(filename, suffix, shard, num_shards)
                if not PathManager.exists(path):
                    raise checkpoints.missing(path)
        return load_model_ensemble_and_task(*args, **kwargs)

    return load_naming_missing_checkpoints


def _name_missing_folders(from_pretrained):
    """``from_pretrained`` with a model or data folder that does not exist fails with
    ``TypeError: expected str ... not NoneType`` (fairseq's ``load_archive_file`` returns None for
    it). Name the folder in one line instead. Names of fairseq's published models (the
    *archive_map*) and URLs are left to fairseq.

    Call site: ``BaseFairseqModel.from_pretrained`` (every model's, ``RealformerModel``'s too)
    imports ``hub_utils`` and calls ``hub_utils.from_pretrained``.

    A stock ``transformer``'s ``from_pretrained``: folders that exist, published names and URLs
    go to fairseq untouched; a local folder that does not exist, which fairseq fails on with a
    ``TypeError``, is named instead."""
    signature = inspect.signature(from_pretrained)

    @functools.wraps(from_pretrained)
    def from_pretrained_naming_missing_folders(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        archive_map = call.arguments.get("archive_map") or {}

        def local(location):
            return isinstance(location, str) and location not in archive_map and "://" not in location

        model, data = call.arguments.get("model_name_or_path"), call.arguments.get("data_name_or_path")
        if local(model) and not os.path.exists(model):
            raise RealformerConfigError(f"from_pretrained: model_name_or_path {model}: no such folder")
        if local(data) and data.startswith(".") and local(model):
            data = os.path.join(model, data)  # fairseq reads a data path starting with '.' in the model folder
        if local(data) and not os.path.exists(data):
            raise RealformerConfigError(f"from_pretrained: data_name_or_path {data}: no such folder")
        return from_pretrained(*args, **kwargs)

    return from_pretrained_naming_missing_folders


def _refuse_missing_restore_file(load_checkpoint):
    """fairseq-train with ``--restore-file FILE`` that does not exist trains from scratch, saying
    only "No existing checkpoint found" in its log: a typo costs a training run. The default,
    ``SAVE_DIR/checkpoint_last.pt``, may be missing (a first launch); a file the user named may
    not.

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.load_checkpoint(cfg.checkpoint,
    trainer)``, which loads ``cfg.restore_file`` with the trainer's ``checkpoint_suffix`` before
    '.pt', unless it is the default name ``checkpoint_last.pt``.

    A stock ``transformer`` run: the same refusal, the one deliberate difference from fairseq
    here (fairseq would train it from scratch). A file that exists, or the default name, goes to
    fairseq untouched; the check reads only ``cfg.restore_file``, the trainer's
    ``checkpoint_suffix`` and ``PathManager.isfile``, as fairseq does."""

    @functools.wraps(load_checkpoint)
    def load_checkpoint_refusing_a_missing_restore_file(cfg, trainer, **kwargs):
        if cfg.restore_file != "checkpoint_last.pt":
            path = cfg.restore_file.replace(".pt", (trainer.checkpoint_suffix or "") + ".pt")
            if not PathManager.isfile(path):
                raise RealformerConfigError(f"--restore-file {path}: no such checkpoint file "
                                            f"(fairseq-train would train from scratch)")  # fmt: skip
        return load_checkpoint(cfg, trainer, **kwargs)

    return load_checkpoint_refusing_a_missing_restore_file


def _name_missing_finetune_model(load_checkpoint):
    """fairseq-train with ``--finetune-from-model FILE`` that does not exist stops with a
    traceback (``ValueError: --finetune-from-model FILE does not exist``); name the file in one
    line instead, as ``--restore-file`` is (a damaged file is named by the loader:
    ``checkpoints.guarded``).

    A stock ``transformer`` run: only that message changes. fairseq decides, as before, whether
    the file is needed (a first launch without ``checkpoint_last.pt``) and whether it exists;
    the error stays a ``ValueError``. If fairseq reworded its message, its own error passes
    through unchanged."""

    @functools.wraps(load_checkpoint)
    def load_checkpoint_naming_a_missing_finetune_model(cfg, trainer, **kwargs):
        try:
            return load_checkpoint(cfg, trainer, **kwargs)
        except ValueError as error:
            path = getattr(cfg, "finetune_from_model", None)
            if path is None or str(error) != f"--finetune-from-model {path} does not exist":
                raise
            raise RealformerConfigError(f"--finetune-from-model {path}: no such checkpoint file") from None

    return load_checkpoint_naming_a_missing_finetune_model


def _half_precision_problem(common, cuda: bool, xla: bool) -> Optional[str]:
    """Why fairseq-train cannot train with the precision flags of *common* (fairseq's
    ``cfg.common``, or its argparse namespace) on this machine, or None. *cuda*: torch sees a CUDA
    GPU; *xla*: torch_xla is installed."""
    if common.bf16 and not xla:  # the plugin's bfloat16 mixed precision, on a CPU or a GPU
        return precision.problem(common)
    if common.tpu:  # fairseq's --bf16 with torch_xla: its TPU run
        return None
    flags = [flag for flag, on in (("--memory-efficient-fp16", common.memory_efficient_fp16), ("--fp16", common.fp16),
                                   ("--amp", common.amp)) if on]  # fmt: skip
    if not flags or (cuda and not common.cpu):
        return None
    why = "--cpu trains on the CPU" if cuda else "torch sees none on this machine"
    return f"{flags[0]} needs a CUDA GPU, and {why}: leave out {flags[0]} to train in float32"


def _check_precision(trainer_init):
    """fairseq-train's half-precision flags fail without a CUDA GPU deep inside fairseq, or do
    something else than they say: --fp16 in its optimizer (``Torch not compiled with CUDA
    enabled``), while --amp trains in float32 (autocast is off without CUDA) and
    --memory-efficient-fp16 in emulated float16. Refuse them in one line before anything is
    built; with a GPU nothing changes. --bf16 without torch_xla (which fairseq would run as a
    TPU run and fail on) trains in bfloat16 mixed precision on the trainer's device, CPU or GPU:
    the trainer is built as for float32 (``cfg.common.bf16`` off: float32 model, plain
    optimizer, no loss scaler), then its criterion runs under the autocast
    (``precision.autocast_training``).

    Call site: ``fairseq_cli.train.main`` (fairseq-train, and fairseq-hydra-train's ``pre_main``)
    builds its ``Trainer(cfg, ...)``, which chooses the device and the precision.

    A stock ``transformer`` run: with a CUDA GPU (and without ``--cpu``), or without these
    flags, nothing; the check reads only ``cfg.common``. Without a GPU, --fp16 fails in fairseq
    too (now in one line), while --amp and --memory-efficient-fp16, which fairseq runs in float32
    or emulated float16, are refused as well: a deliberate difference, for every model alike.
    --bf16 trains in bfloat16 mixed precision, where fairseq fails without torch_xla."""

    @functools.wraps(trainer_init)
    def init_checking_precision(self, cfg, *args, **kwargs):
        common = getattr(cfg, "common", cfg)
        problem = _half_precision_problem(common, torch.cuda.is_available(), precision.xla_installed())
        if problem is not None:
            raise RealformerConfigError(problem)
        bf16 = precision.requested(common)
        if bf16:  # a float32 trainer, on the device fairseq chooses (not a TPU)
            common.bf16 = common.tpu = False
        trainer_init(self, cfg, *args, **kwargs)
        if bf16:
            precision.warn_if_emulated(self.device.type, _prog())
            precision.autocast_training(self)

    return init_checking_precision


def _bf16_without_tpu(call_main):
    """fairseq's parser turns ``--bf16`` into ``--tpu``, and ``call_main`` then skips the
    distributed set-up (``infer_init_method`` returns at once for a TPU) and spawns several GPUs
    through torch_xla. Without torch_xla, --bf16 is the plugin's mixed precision on the CPU or the
    GPUs: take ``--tpu`` back off before fairseq reads it.

    Call site: ``cli_main`` of fairseq-train and fairseq-interactive call
    ``distributed_utils.call_main(cfg, main)`` (fairseq-hydra-train too; its ``common.bf16``
    never turns on ``tpu``).

    A stock ``transformer`` run: nothing without --bf16 (or with torch_xla installed)."""

    @functools.wraps(call_main)
    def call_main_without_tpu_for_bf16(cfg, main, **kwargs):
        if precision.requested(cfg.common):
            cfg.common.tpu = False
        return call_main(cfg, main, **kwargs)

    return call_main_without_tpu_for_bf16


def _translate_in_bf16(main):
    """fairseq-generate and fairseq-interactive apply --fp16 to the models (``model.half()``) but
    never --bf16: they would translate in float32 without a word. With --bf16 (and no torch_xla)
    the whole translation runs under the bf16 autocast on its device: the models stay float32
    and the matrix products run in bfloat16; the autocast's bfloat16 copy of each weight is made
    once for the whole run.

    Call site: ``cli_main`` calls ``main(args)`` (fairseq-generate) or hands ``main`` to
    ``distributed_utils.call_main`` (fairseq-interactive), looking it up in its module.

    A stock ``transformer``: without --bf16 the same translation; with it, bfloat16's."""

    @functools.wraps(main)
    def main_in_bf16(cfg, *args, **kwargs):
        common = getattr(cfg, "common", cfg)
        if not precision.requested(common):
            return main(cfg, *args, **kwargs)
        precision.check(common)
        common.tpu = False  # fairseq's parser turned it on with --bf16
        device_type = "cuda" if torch.cuda.is_available() and not common.cpu else "cpu"
        precision.warn_if_emulated(device_type, _prog())
        with precision.autocast(device_type):
            return main(cfg, *args, **kwargs)

    return main_in_bf16


# fairseq scripts its models with TorchScript (``torch.jit.script``: fairseq-generate's export,
# fairseq's own tests), which compiles FairseqDropout.forward and utils.log_softmax from their
# source. The two replacements below are therefore plain, scriptable functions that repeat
# fairseq's few lines; the Python-only bf16 branch sits behind ``torch.jit.is_scripting()``, and
# its helpers are ``torch.jit.unused`` (compiled as a stub that is never reached).


@torch.jit.unused
def _fast_dropout_here(x: torch.Tensor) -> bool:
    return precision.fast_dropout_here(x)


@torch.jit.unused
def _fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    return precision.dropout(x, p)


def _dropout_with_fast_masks_in_bf16(self, x, inplace: bool = False):
    """FairseqDropout.forward (fairseq's lines), with masks from ``precision.dropout`` under
    the bf16 autocast on a CPU."""
    if self.p > 0 and (self.training or self.apply_during_inference):
        if not torch.jit.is_scripting() and _fast_dropout_here(x):
            return _fast_dropout(x, self.p)
        return F.dropout(x, p=self.p, training=True, inplace=inplace)
    else:
        return x


def _fast_dropout_in_bf16(forward):
    """fairseq's dropout (``FairseqDropout``: every fairseq layer's, and the plugin's) draws its
    masks with ``precision.dropout`` under the bf16 autocast on a CPU, twice as fast as
    ``F.dropout``'s ``bernoulli_``, which took 16 % of a bf16 update at the quality study's size
    (``precision``'s docstring). Same keep probability and scaling; other random draws.

    Call site: every module calls its ``dropout_module(x)`` (``nn.Module.__call__``).

    A stock ``transformer`` run: without --bf16, or on a GPU, fairseq's own lines run (and are
    what TorchScript compiles); in bf16 on a CPU, the masks come from ``torch.rand``."""
    return _dropout_with_fast_masks_in_bf16


@torch.jit.unused
def _bf16_logits_on_cpu(x: torch.Tensor, dim: int) -> bool:
    return x.dtype == precision.DTYPE and x.device.type == "cpu" and dim in (-1, x.dim() - 1)


@torch.jit.unused
def _blocked_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return precision.log_softmax_from_bf16(x)


def _log_softmax_in_blocks_from_bf16(x, dim: int, onnx_trace: bool = False):
    """fairseq.utils.log_softmax (fairseq's lines), from bfloat16 logits on a CPU in row blocks."""
    if not torch.jit.is_scripting() and not onnx_trace and _bf16_logits_on_cpu(x, dim):
        return _blocked_log_softmax(x)
    if onnx_trace:
        return F.log_softmax(x.float(), dim=dim)
    else:
        return F.log_softmax(x, dim=dim, dtype=torch.float32)


def _log_softmax_from_bf16(log_softmax):
    """The decoders' log-probabilities from bfloat16 logits (the bf16 autocast's output
    projection) on a CPU: ``precision.log_softmax_from_bf16``, the same float32 values bit for
    bit and a bfloat16 gradient, faster.

    Call site: ``FairseqDecoder.get_normalized_probs_scriptable`` calls ``utils.log_softmax``
    (every fairseq decoder's ``get_normalized_probs``).

    A stock ``transformer`` run: float32 logits (no --bf16), or a GPU, run fairseq's own lines
    (and TorchScript compiles them)."""
    return _log_softmax_in_blocks_from_bf16


def _hub_generates_in_bf16(generate):
    """The hub interface (``from_pretrained``) translates in bf16 when loaded with ``bf16=True``
    (fairseq's keyword arguments set the loaded configuration: ``cfg.common.bf16``): every
    ``translate``, ``sample`` and ``generate`` then runs under the bf16 autocast on the models'
    device, the models staying float32.

    Call site: ``translate`` and ``sample`` call ``self.generate``.

    A stock ``transformer``'s hub: without ``bf16=True`` nothing changes."""

    @functools.wraps(generate)
    def generate_in_bf16(self, *args, **kwargs):
        common = self.cfg.common
        if not precision.requested(common):
            return generate(self, *args, **kwargs)
        precision.check(common)
        with precision.autocast(self.device.type):
            return generate(self, *args, **kwargs)

    return generate_in_bf16


def _prog() -> str:
    """The command being run, as the user typed it (fairseq-train, translate.py, ...)."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else "python"


# The folders fairseq-train made for its save dir in this process, outermost first.
_new_save_dirs: list = []


def _remember_new_save_dir(verify_checkpoint_directory):
    """fairseq-train makes its save dir before it builds the model and loads the data, so a run
    that the plugin refuses after that point (a missing --restore-file, half precision without a
    GPU, a damaged checkpoint) would leave an empty save dir behind. Remember the folders made
    here; ``_one_line_errors`` removes those still empty when such an error ends the process.
    Plugin flags are checked before (``options.check``, while parsing): no folder at all.

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.verify_checkpoint_directory(
    cfg.checkpoint.save_dir)`` on the master process, which makes the folder."""

    @functools.wraps(verify_checkpoint_directory)
    def verify_remembering_new_folders(save_dir, *args, **kwargs):
        _new_save_dirs.extend(folders.missing(save_dir))
        return verify_checkpoint_directory(save_dir, *args, **kwargs)

    return verify_remembering_new_folders


def _one_line_errors(previous_hook):
    """fairseq's CLIs let exceptions from model construction escape as deep tracebacks; for
    mistakes the user fixes by changing a flag or a file (``RealformerConfigError``), the
    message is all that helps: ``fairseq-train: error: ...``, and a save dir fairseq-train made
    for the run is taken back while still empty. Every other exception goes to the previous hook
    unchanged.

    A stock ``transformer`` run: only the plugin's own errors (``RealformerConfigError``: the
    patches above, e.g. a missing --restore-file), and fairseq's refusal of --fp16 with --bf16,
    are shortened; fairseq's other exceptions print their tracebacks as before."""

    def print_config_errors_as_one_line(exc_type, exc, tb):
        message = str(exc) if issubclass(exc_type, RealformerConfigError) else _bf16_with_fp16(exc)
        if message is not None:
            print(f"{_prog()}: error: {message}", file=sys.stderr)
            folders.remove_empty(_new_save_dirs)
            return
        previous_hook(exc_type, exc, tb)

    return print_config_errors_as_one_line


def _bf16_with_fp16(exc) -> Optional[str]:
    """The one-line form of fairseq's parser refusing --fp16 with --bf16 (a ``ValueError`` about
    --tpu, which --bf16 turns on and the user never typed), or None for any other exception."""
    asked = {"--bf16", "--memory-efficient-bf16"} & set(sys.argv[1:])
    if type(exc) is ValueError and str(exc) == "Cannot combine --fp16 and --tpu, use --bf16 on TPUs" and asked:
        if not precision.xla_installed():
            efficient = "--memory-efficient-bf16" in asked
            return precision.problem(argparse.Namespace(bf16=True, fp16=True, memory_efficient_bf16=efficient))
    return None
