"""Validation loss of checkpoints with dropout off, as fairseq validates and translates, and on, as
the model trains. A deep Post-LN model can keep learning with dropout on while its dropout-off loss
breaks (benchmarks/RESULTS.md: depth stability, and the 12+12-layer runs); fairseq's logged
validation loss alone cannot tell that from a model that learned nothing.

    python studies/dropout_gap.py runs/depth-12/post-ln-lr0.004-layers12/seed1
    python studies/dropout_gap.py CHECKPOINT.pt [CHECKPOINT.pt ...] --data DATA_BIN
    python studies/dropout_gap.py RUN --json RUN/dropout_gap.json   # the table as JSON too

A run folder of studies/quality.py stands for its epoch checkpoints (checkpoints/checkpointN.pt,
in epoch order), then the averaged one (checkpoint_avg.pt) if it has it; its data is its bin/
unless --data says. The loss is fairseq's: the criterion's loss per target token in bits (label
smoothing included) over every sentence of --subset. With dropout on, the masks are drawn from
--seed, so a re-run prints the same numbers.
"""

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: common/ and studies/
from common.repo import USER_DIR, import_fairseq_quietly  # noqa: E402  (puts this checkout's plugin on the path)

PROG = "dropout_gap.py"
EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")


class InputError(Exception):
    """Bad input, said in one line."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="RUN_OR_CHECKPOINT", help="quality.py run folders or checkpoint files")
    p.add_argument("--data", help="binarised data folder (default: a run folder's bin/)")
    p.add_argument("--subset", default="valid", help="the split to score (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seed of the dropout masks (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the rows to FILE (studies/quality.py --dropout-gap)")
    return p.parse_args(argv)


def checkpoints_of(path: Path, data):
    """[(checkpoint file, data folder)] that *path* stands for."""
    if path.is_file():
        if data is None:
            raise InputError(f"{path}: a checkpoint file needs --data")
        return [(path, Path(data))]
    if not path.is_dir():
        raise InputError(f"{path}: no such run folder or checkpoint")
    folder = path / "checkpoints"
    epochs = sorted(
        (int(m.group(1)), f) for f in folder.glob("checkpoint*.pt") if (m := EPOCH_CHECKPOINT.search(f.name))
    )
    files = [f for _, f in epochs] + [f for f in [folder / "checkpoint_avg.pt"] if f.exists()]
    if not files:
        raise InputError(f"{path}: no checkpoints/checkpointN.pt or checkpoint_avg.pt in it")
    return [(f, Path(data) if data else path / "bin") for f in files]


def load(checkpoint: Path, data: Path, subset: str):
    """The model, the task with *subset* loaded, the criterion, and the checkpoint's updates."""
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
    return models[0], task, task.build_criterion(cfg.criterion), updates


def loss_in_bits(model, task, criterion, subset: str, max_tokens: int, dropout: bool, seed: int) -> float:
    """fairseq's validation loss of *subset*, with dropout off (eval mode) or on (train mode)."""
    import torch
    from fairseq import utils

    batches = task.get_batch_iterator(
        dataset=task.dataset(subset),
        max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        seed=seed,
    ).next_epoch_itr(shuffle=False)
    model.train(dropout)
    torch.manual_seed(seed)
    total, size = 0.0, 0
    with torch.no_grad():
        for sample in batches:
            _, sample_size, logged = criterion(model, sample)
            total, size = total + float(logged["loss"]), size + sample_size
    return total / size / math.log(2)


def main(argv=None):
    args = parse_args(argv)
    import_fairseq_quietly()  # fairseq's loading chatter is not this table
    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=str(USER_DIR)))
    try:
        runs = [c for p in args.paths for c in checkpoints_of(Path(p), args.data)]
        rows = []
        for checkpoint, data in runs:
            model, task, criterion, updates = load(checkpoint, data, args.subset)
            off, on = (
                loss_in_bits(model, task, criterion, args.subset, args.max_tokens, dropout, args.seed)
                for dropout in (False, True)
            )
            rows.append((checkpoint, updates, off, on))
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{args.subset} loss (bits per target token), dropout off (as fairseq validates) and on (as it trains)\n")
    print("| checkpoint | updates | dropout off | dropout on | on − off |")
    print("|---|---|---|---|---|")
    for checkpoint, updates, off, on in rows:
        print(f"| {checkpoint} | {updates} | {off:.3f} | {on:.3f} | {on - off:+.3f} |")
    if args.json:
        record = {
            "subset": args.subset,
            "seed": args.seed,
            "unit": "bits per target token",
            "rows": [
                {"checkpoint": str(c), "updates": u, "dropout_off": round(off, 4), "dropout_on": round(on, 4)}
                for c, u, off, on in rows
            ],
        }
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")  # a record that exists is whole: quality.py skips it
        partial.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(partial, path)
    return rows


if __name__ == "__main__":
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin loads checkpoints safely
    main()
