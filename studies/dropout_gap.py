"""Validation loss of checkpoints with dropout off, as fairseq validates and translates, and on, as
the model trains: a deep Post-LN model can keep learning with dropout on while its dropout-off loss
breaks (benchmarks/RESULTS.md), which fairseq's logged loss cannot tell from learning nothing.

    python studies/dropout_gap.py runs/depth-12/post-ln-lr0.004-layers12/seed1
    python studies/dropout_gap.py CHECKPOINT.pt [CHECKPOINT.pt ...] --data DATA_BIN
    python studies/dropout_gap.py RUN --json RUN/dropout_gap.json   # the table as JSON too

A run folder of studies/quality.py stands for its epoch checkpoints in epoch order, then its
averaged one if it has it, on its bin/ unless --data says. The loss is fairseq's: the criterion's,
label smoothing included, in bits per target token over --subset; dropout's masks are drawn from
--seed, so a re-run prints the same numbers.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import math
import os
from pathlib import Path

from common.commands import exit_on_failure
from common.results import write_result
from studies.checkpoints import batches, checkpoints_of, import_plugin, load, parser

PROG = "dropout_gap.py"


def parse_args(argv=None):
    p = parser(PROG, __doc__)
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
    rows = []
    with exit_on_failure(PROG):
        for checkpoint, data in [c for p in args.paths for c in checkpoints_of(Path(p), args.data)]:
            model, task, criterion, updates, _ = load(checkpoint, data, args.subset)
            off, on = (
                loss_in_bits(model, task, criterion, args.subset, args.max_tokens, dropout, args.seed)
                for dropout in (False, True)
            )
            rows.append((checkpoint, updates, off, on))
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
