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

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # this checkout: its packages, first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    safe = ["-P"] if sys.version_info >= (3, 11) else []  # -P: no package of the folder it runs in (another checkout)
    os.execve(sys.executable, [sys.executable, *safe, "-m", "studies.dropout_gap", *sys.argv[1:]], env)

import argparse
import math
import os
import sys
from pathlib import Path

from common.results import write_result
from studies.checkpoints import InputError, add_arguments, batches, checkpoints_of, import_plugin, load

PROG = "dropout_gap.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--seed", type=int, default=1, help="seed of the dropout masks (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the rows to FILE (studies/quality.py --dropout-gap)")
    return p.parse_args(argv)


def loss_in_bits(model, task, criterion, subset: str, max_tokens: int, dropout: bool, seed: int) -> float:
    """fairseq's validation loss of *subset*, with dropout off (eval mode) or on (train mode)."""
    import torch

    model.train(dropout)
    torch.manual_seed(seed)
    total, size = 0.0, 0
    with torch.no_grad():
        for sample in batches(model, task, subset, max_tokens, seed):
            _, sample_size, logged = criterion(model, sample)
            total, size = total + float(logged["loss"]), size + sample_size
    return total / size / math.log(2)


def main(argv=None):
    args = parse_args(argv)
    import_plugin()
    try:
        runs = [c for p in args.paths for c in checkpoints_of(Path(p), args.data)]
        rows = []
        for checkpoint, data in runs:
            model, task, criterion, updates, _ = load(checkpoint, data, args.subset)
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
    if args.json:  # written whole: quality.py --dropout-gap skips a run whose record exists
        rows_kept = [
            {"checkpoint": str(c), "updates": u, "dropout_off": round(off, 4), "dropout_on": round(on, 4)}
            for c, u, off, on in rows
        ]
        measured = {"subset": args.subset, "seed": args.seed, "unit": "bits per target token", "rows": rows_kept}
        write_result(args.json, __file__, argv, **measured)
    return rows


if __name__ == "__main__":
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin loads checkpoints safely
    main()
