"""What the depth-study tools share: the checkpoint diagnostics' (dropout_gap.py, source_use.py)
command line, loading a checkpoint with its task and criterion, a training's task built from its
fairseq-train flags, and a subset's batches in a fixed order. Bad input is an ``InputError``, said
in one line by the script (common.commands.exit_on_failure)."""

import argparse
from pathlib import Path

from common.commands import InputError
from common.repo import USER_DIR, import_fairseq_quietly
from studies.runs import RunFolder


def parser(prog, doc) -> argparse.ArgumentParser:
    """The diagnostics' parser: the run folders or checkpoints to score, their data, the subset and
    the batch size."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="RUN_OR_CHECKPOINT", help="quality.py run folders or checkpoint files")
    p.add_argument("--data", help="binarised data folder (default: a run folder's bin/)")
    p.add_argument("--subset", default="valid", help="the split to score (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default: %(default)s)")
    return p


def checkpoints_of(path: Path, data, average_only=False):
    """[(checkpoint file, data folder)] that *path* stands for: itself, a checkpoint file (with
    --data), or a quality.py run folder's kept checkpoints (RunFolder.checkpoints), on its bin/
    unless --data."""
    if path.is_file():
        if data is None:
            raise InputError(f"{path}: a checkpoint file needs --data")
        return [(path, Path(data))]
    if not path.is_dir():
        raise InputError(f"{path}: no such run folder or checkpoint")
    run = RunFolder(path)
    files = run.checkpoints(average_only)
    if not files:
        raise InputError(f"{path}: no {run.KEPT[average_only]} in it")
    return [(f, Path(data) if data else run.bin) for f in files]


def import_plugin() -> None:
    """fairseq and this checkout's plugin, registered, with fairseq's loading chatter kept out of the table."""
    import_fairseq_quietly()
    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=str(USER_DIR)))


def load(checkpoint, data, subset: str):
    """The model, the task with *subset* loaded, the criterion, the checkpoint's updates and its
    configuration."""
    from fairseq import checkpoint_utils

    if not data.is_dir():
        raise InputError(f"{data}: no such data folder (--data)")
    overrides = {"data": str(data)}
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint), overrides)
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides=overrides, state=state
        )
        task.load_dataset(subset)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InputError(f"{checkpoint} on {data} (--subset {subset}): {type(e).__name__}: {first}") from None
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates")
    return models[0], task, task.build_criterion(cfg.criterion), updates, cfg


def training_task(flags, *subsets):
    """(fairseq cfg, task) of fairseq-train's *flags*, with the training data and *subsets* loaded."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), flags))
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, epoch=1, combine=True)
    for subset in subsets:
        task.load_dataset(subset, epoch=1, combine=False)
    return cfg, task


def batches(model, task, subset: str, max_tokens: int, seed: int = 1):
    """*subset*'s batches in fairseq's validation order (sorted by length, not shuffled)."""
    from fairseq import utils

    return task.get_batch_iterator(
        dataset=task.dataset(subset),
        max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        seed=seed,
    ).next_epoch_itr(shuffle=False)
