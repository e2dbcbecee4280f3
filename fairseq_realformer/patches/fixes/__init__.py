"""fairseq's defects that the plugin fixes for every model while it is loaded, and the switch that
turns them all off.

Importing ``fairseq_realformer`` (which ``--user-dir`` does) installs each fix of ``FIXES``: it
replaces one fairseq function (``replaces``) by a wrapper around it, after checking that the
fairseq functions named as its call sites still look it up there (``patching.patch``). Each fix's
docstring gives its fairseq issue where one is known, its call site, and what changes for a stock
``transformer`` run; ``docs/checkpoints-and-errors.md`` lists them in one table.

``REALFORMER_FAIRSEQ_FIXES=0`` in the environment installs none of them: fairseq then behaves as
it does alone, but for what the model itself needs (``model_support``: checkpoints load under
``torch.load(weights_only=True)``, ADMIN's ω are set after fairseq-train loads its checkpoint).
The plugin's own errors are then tracebacks, and ``--bf16`` is fairseq's TPU run.
"""

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Tuple

from ...errors import RealformerConfigError
from ..patching import patch
from .batching import keep_last_batch, same_batches_after_resuming
from .checkpoint_contents import drop_better_transformer_copies
from .checkpoint_files import (
    copy_checkpoints_whole,
    name_missing_checkpoints,
    name_missing_finetune_model,
    name_missing_folders,
    refuse_missing_restore_file,
)
from .half_precision import (
    bf16_without_tpu,
    check_precision,
    fast_dropout_in_bf16,
    hub_generates_in_bf16,
    log_softmax_from_bf16,
    translate_in_bf16,
)
from .one_line_errors import one_line_errors, remember_new_save_dir
from .patience import resume_patience, save_patience
from .wall_clock import restart_wall_clock

SWITCH = "REALFORMER_FAIRSEQ_FIXES"


@dataclass(frozen=True)
class Fix:
    """One fix: *wrap* turns fairseq's function *replaces* (a dotted path: ``module.function`` or
    ``module.Class.method``) into its replacement; *call_sites* are the fairseq functions (dotted
    paths) that must still look it up where it is replaced."""

    wrap: Callable[[Callable], Callable]
    replaces: str
    call_sites: Tuple[str, ...] = ()


# In the order they are installed: of the fixes of one function, the later wraps the earlier.
FIXES = (
    Fix(
        keep_last_batch,
        "fairseq.data.data_utils.batch_by_size",
        ("fairseq.data.fairseq_dataset.FairseqDataset.batch_by_size",),
    ),
    # the trainer calls it on the task, found on the task's class at call time: no call site to check
    Fix(same_batches_after_resuming, "fairseq.tasks.fairseq_task.FairseqTask.get_batch_iterator"),
    Fix(
        name_missing_checkpoints,
        "fairseq.checkpoint_utils.load_model_ensemble_and_task",
        ("fairseq.checkpoint_utils.load_model_ensemble", "fairseq.hub_utils.from_pretrained"),
    ),
    Fix(
        name_missing_folders,
        "fairseq.hub_utils.from_pretrained",
        ("fairseq.models.fairseq_model.BaseFairseqModel.from_pretrained",),
    ),
    Fix(
        drop_better_transformer_copies,
        "fairseq.checkpoint_utils.load_checkpoint_to_cpu",
        ("fairseq.trainer.Trainer.load_checkpoint", "fairseq.checkpoint_utils.load_model_ensemble_and_task"),
    ),
    Fix(name_missing_finetune_model, "fairseq.checkpoint_utils.load_checkpoint", ("fairseq_cli.train.main",)),
    Fix(refuse_missing_restore_file, "fairseq.checkpoint_utils.load_checkpoint", ("fairseq_cli.train.main",)),
    Fix(restart_wall_clock, "fairseq.checkpoint_utils.load_checkpoint", ("fairseq_cli.train.main",)),
    # checkpoint_utils.save_checkpoint calls it on the trainer, found on its class: no call site to check
    Fix(save_patience, "fairseq.trainer.Trainer.save_checkpoint"),
    Fix(resume_patience, "fairseq.checkpoint_utils.load_checkpoint", ("fairseq_cli.train.main",)),
    Fix(copy_checkpoints_whole, "fairseq.file_io.PathManager.copy", ("fairseq.checkpoint_utils.save_checkpoint",)),
    Fix(check_precision, "fairseq.trainer.Trainer.__init__", ("fairseq_cli.train.main",)),
    Fix(
        bf16_without_tpu,
        "fairseq.distributed.utils.call_main",
        ("fairseq_cli.train.cli_main", "fairseq_cli.interactive.cli_main"),
    ),
    Fix(translate_in_bf16, "fairseq_cli.generate.main", ("fairseq_cli.generate.cli_main",)),
    Fix(translate_in_bf16, "fairseq_cli.interactive.main", ("fairseq_cli.interactive.cli_main",)),
    Fix(
        hub_generates_in_bf16,
        "fairseq.hub_utils.GeneratorHubInterface.generate",
        ("fairseq.hub_utils.GeneratorHubInterface.sample",),
    ),
    # every module's __call__ looks forward up on its class: no call site to check
    Fix(fast_dropout_in_bf16, "fairseq.modules.fairseq_dropout.FairseqDropout.forward"),
    Fix(
        log_softmax_from_bf16,
        "fairseq.utils.log_softmax",
        ("fairseq.models.fairseq_decoder.FairseqDecoder.get_normalized_probs_scriptable",),
    ),
    Fix(remember_new_save_dir, "fairseq.checkpoint_utils.verify_checkpoint_directory", ("fairseq_cli.train.main",)),
    Fix(one_line_errors, "sys.excepthook"),  # the interpreter calls it: no call site to check
)


def enabled() -> bool:
    """The fixes are wanted: ``REALFORMER_FAIRSEQ_FIXES`` is unset or 1 (0: none of them)."""
    value = os.environ.get(SWITCH) or "1"
    if value not in ("0", "1"):
        raise RealformerConfigError(
            f"{SWITCH}={value}: 1 (the default) installs the plugin's fixes to fairseq, 0 none of them"
        )
    return value == "1"


def install() -> None:
    """Install every fix of ``FIXES``, once (a second import of the plugin changes nothing),
    unless ``REALFORMER_FAIRSEQ_FIXES=0``."""
    if not enabled():
        return
    for fix in FIXES:
        owner, name = where(fix.replaces)
        patch(owner, name, fix.wrap, call_sites=[resolve(site) for site in fix.call_sites])


def where(path: str):
    """(owner, attribute name) of a dotted path: ``fairseq.utils.log_softmax`` → (the module
    ``fairseq.utils``, "log_softmax")."""
    owner, _, name = path.rpartition(".")
    return resolve(owner), name


def resolve(path: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            found = sys.modules.get(module_name) or importlib.import_module(module_name)
        except ModuleNotFoundError as error:  # no such module (or its parent is none): an attribute
            if not (module_name == error.name or module_name.startswith(f"{error.name}.")):
                raise  # a module that exists failed to import: not ours to hide
            continue
        for part in parts[end:]:
            found = getattr(found, part)
        return found
    raise ImportError(f"fairseq_realformer: no module in {path!r}")
