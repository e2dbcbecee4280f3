"""fairseq's entry points stop on a checkpoint file or folder that does not exist with a
traceback, or do not stop at all: each is named in one line instead. What is wrong with a
checkpoint file, and how it is said, is ``checkpoints``'s (damaged files are named by its loader,
``checkpoints.guarded``, which ``model_support`` installs)."""

import functools
import inspect
import os

from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from ...errors import RealformerConfigError
from ...files import checkpoints


def copy_checkpoints_whole(copy):
    """fairseq-train saves each checkpoint atomically (a ``.tmp`` file, renamed), then copies it to
    ``checkpoint_last.pt``, ``checkpoint_best.pt``, ... in place. A run stopped during one of those
    copies (Ctrl-C, a job's time limit, a killed session) leaves ``checkpoint_last.pt`` cut short,
    and the same command run again stops on it instead of resuming. Copy to a file beside the
    destination and rename it: the destination is always the old file or the new one, whole.

    Call site: ``checkpoint_utils.save_checkpoint`` calls ``PathManager.copy(checkpoints[0], cp,
    overwrite=True)`` for each further checkpoint name.

    A stock ``transformer`` run: the same files with the same bytes; a file ``NAME.partial`` exists
    beside each during its copy. Paths that ioPath's remote handlers serve
    (``PathManager.path_requires_pathmanager``), and a copy that must not overwrite an existing
    file, are copied by fairseq as before."""

    @functools.wraps(copy)
    def copy_then_rename(src_path, dst_path, overwrite=False):
        if PathManager.path_requires_pathmanager(dst_path) or (not overwrite and os.path.exists(dst_path)):
            return copy(src_path, dst_path, overwrite)
        partial = f"{dst_path}.partial"
        try:
            copied = copy(src_path, partial, True)
            os.replace(partial, dst_path)
        finally:
            if os.path.exists(partial):  # the copy failed: the destination is untouched
                os.remove(partial)
        return dst_path if isinstance(copied, str) else copied  # shutil.copyfile's answer is the destination

    return copy_then_rename


def name_missing_checkpoints(load_model_ensemble_and_task):
    """fairseq-generate, fairseq-interactive and the hub stop on a checkpoint path that does not
    exist with a traceback (``OSError: Model file not found``). Name the file in one line instead.

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
        filenames, suffix, num_shards = (
            call.arguments.get(k, d) for k, d in (("filenames", []), ("suffix", ""), ("num_shards", 1))
        )
        for filename in filenames:
            for shard in range(num_shards):
                path = checkpoint_utils.get_maybe_sharded_checkpoint_filename(filename, suffix, shard, num_shards)
                if not PathManager.exists(path):
                    raise checkpoints.missing(path)
        return load_model_ensemble_and_task(*args, **kwargs)

    return load_naming_missing_checkpoints


def name_missing_folders(from_pretrained):
    """``from_pretrained`` with a model or data folder that does not exist fails with
    ``TypeError: expected str ... not NoneType`` (fairseq issue #2048: fairseq's
    ``load_archive_file`` returns None for it). Name the folder in one line instead. Names of
    fairseq's published models (the *archive_map*) and URLs are left to fairseq.

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


def refuse_missing_restore_file(load_checkpoint):
    """fairseq-train with ``--restore-file FILE`` that does not exist trains from scratch, saying
    only "No existing checkpoint found" in its log: a typo costs a training run (metaseq, fairseq's
    sibling, has the same request open: "Hard fail if restore-file not found", metaseq #602). The
    default, ``SAVE_DIR/checkpoint_last.pt``, may be missing (a first launch); a file the user
    named may not.

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.load_checkpoint(cfg.checkpoint,
    trainer)``, which loads the file ``checkpoints.restore_file_path`` names (``cfg.restore_file``
    with the trainer's ``checkpoint_suffix`` before '.pt').

    A stock ``transformer`` run: the same refusal, the one deliberate difference from fairseq
    here (fairseq would train it from scratch). A file that exists, or the default name, goes to
    fairseq untouched; the check reads only ``cfg.restore_file``, the trainer's
    ``checkpoint_suffix`` and ``PathManager.isfile``, as fairseq does."""

    @functools.wraps(load_checkpoint)
    def load_checkpoint_refusing_a_missing_restore_file(cfg, trainer, **kwargs):
        if cfg.restore_file != checkpoints.DEFAULT_RESTORE_FILE:
            path = checkpoints.restore_file_path(cfg.restore_file, cfg.save_dir, trainer.checkpoint_suffix)
            if not PathManager.isfile(path):
                raise checkpoints.missing(path, flag="--restore-file", note="fairseq-train would train from scratch")
        return load_checkpoint(cfg, trainer, **kwargs)

    return load_checkpoint_refusing_a_missing_restore_file


def name_missing_finetune_model(load_checkpoint):
    """fairseq-train with ``--finetune-from-model FILE`` that does not exist stops with a
    traceback (``ValueError: --finetune-from-model FILE does not exist``); name the file in one
    line instead, as ``--restore-file`` is.

    Call site: ``fairseq_cli.train.main`` calls ``checkpoint_utils.load_checkpoint(cfg.checkpoint,
    trainer)``, which raises that ``ValueError`` on a first launch (no ``checkpoint_last.pt``).

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
            raise checkpoints.missing(path, flag="--finetune-from-model") from None

    return load_checkpoint_naming_a_missing_finetune_model
