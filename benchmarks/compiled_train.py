"""fairseq-train with ``--compile-layers`` against the same training eager, as a user runs it: words
per second, the training loss at the end and the validation loss of every epoch.

The same architecture, data and flags, one run after the other: eager with each of ``--seeds``,
compiled with the first (dropout draws other masks compiled than eager, so the two agree within the
eager seeds' spread, not to the digit). words/s: the median of fairseq's logged ``wps`` after the
first ``--skip`` updates (the compiled run compiles in its first steps); the compiled run's compile
time is kept from its log. Data: ``toy``, the toy corpus (scripts/toy_corpus.py, no download), for
``--updates`` updates without validation; or ``multi30k``, as the Multi30k recipe binarises it, for
``--epochs`` epochs with validation after each.

    python benchmarks/compiled_train.py --bf16 --json benchmarks/results/gpu-compiled-train.json
    python benchmarks/compiled_train.py --tiny --updates 20 --skip 10   # a CPU rehearsal, minutes
    python benchmarks/compiled_train.py --data multi30k --epochs 3 --seeds 1,2 --skip 100 \\
        --json benchmarks/results/cpu-compiled-train-multi30k.json    # the quality study's 4+4 model
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import shlex
import tempfile
from pathlib import Path

import torch

from benchmarks.bench import fairseq_program, log_records, prepare_data, say, table, train_log, write_json
from common import allocator, commands
from common.host import host
from common.presets import PRESETS, TRAINING
from common.repo import USER_DIR, VARIANTS

TINY = (
    "--encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --encoder-attention-heads 2 --encoder-layers 2 "
    "--decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 2 --decoder-layers 2"
).split()
# the quality study's CPU model (studies/quality.py --preset cpu, the recipe's dropout 0.3)
CPU = PRESETS["cpu"]
MULTI30K_MODEL = ["--arch", "realformer_iwslt_de_en", *CPU.model_flags(), "--dropout", "0.3"]
MULTI30K_MODEL += ["--lr", f"{CPU.lr:g}", "--warmup-updates", str(CPU.warmup)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=("toy", "multi30k"), default="toy", help="(default: %(default)s)")
    p.add_argument("--arch", default="realformer_wmt_en_de", help="toy data (default: %(default)s, 6L-6L, 512/2048/8)")
    p.add_argument("--updates", type=int, default=200, help="toy data: updates per run (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="multi30k: epochs per run (default: %(default)s)")
    p.add_argument("--seeds", default="1", help="eager runs' seeds; the compiled run takes the first (default: 1)")
    p.add_argument("--skip", type=int, default=50, help="updates left out of words/s (default: %(default)s)")
    p.add_argument("--bf16", action="store_true", help="fairseq-train --bf16 (the plugin's mixed precision)")
    p.add_argument("--tiny", action="store_true", help="toy data: 2+2 layers, width 32, 2,000 pairs (a rehearsal)")
    p.add_argument("--work", help="folder for the data and the runs' logs (default: a temporary one)")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    return args


def flags(args):
    """What both runs train with, after the data and the plugin."""
    if args.data == "multi30k":
        length = ["--max-epoch", str(args.epochs), "--source-lang", "en", "--target-lang", "de"]
        return [*MULTI30K_MODEL, *VARIANTS["realformer"], *length]
    toy = [*("--arch", args.arch), *(TINY if args.tiny else []), "--lr", "1e-3", "--warmup-updates", "50"]
    return [*toy, "--max-update", str(args.updates), "--disable-validation"]


def train(args, data: Path, work: Path, seed: int, compiled: bool) -> dict:
    """One fairseq-train run: words/s, the last logged training loss, the validation losses,
    the compile line."""
    name = f"{'compiled' if compiled else 'eager'}-seed{seed}"
    command = [fairseq_program("fairseq-train"), str(data), "--user-dir", str(USER_DIR), *TRAINING]
    command += [*"--lr-scheduler inverse_sqrt --max-tokens 4096 --no-save --log-interval 10".split(), *flags(args)]
    command += ["--seed", str(seed), *(["--bf16"] if args.bf16 else []), *(["--compile-layers"] if compiled else [])]
    say("compiled-train", f"{name}: {shlex.join(command)}")
    run = commands.run(command, work / f"{name}.log", cwd=work, env=allocator.environment(), name=f"the {name} run")
    _, logged = train_log(run.output, args.skip + 1)
    valid_loss = [[int(v["epoch"]), v["loss"]] for v in log_records(run.output, "valid")]
    return {"seed": seed, "compiled": compiled, "wall_s": round(run.seconds, 1), **logged, "valid_loss": valid_loss}


def write_results(args, argv, runs, ratio):
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    write_json(args, __file__, argv, device, host(), drop=("work",), runs=runs, wps_ratio=ratio)


def main(argv=None):
    args = parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="compiled-train-"))
    data = prepare_data(args.data, work, "compiled-train", tiny=args.tiny)
    runs = []
    for seed, compiled in [(seed, False) for seed in args.seeds] + [(args.seeds[0], True)]:
        runs.append(train(args, data, work, seed, compiled))
        write_results(args, argv, runs, None)  # a run stopped at a time limit keeps the runs it finished
    eager, compiled = runs[0], runs[-1]
    ratio = compiled["wps"] / eager["wps"] if eager["wps"] and compiled["wps"] else None
    loss_change = (compiled["loss_at_end"] - eager["loss_at_end"]) / eager["loss_at_end"]
    header = ["run", f"words/s (after update {args.skip})", "training loss at the end", "wall s"]
    header += [f"valid loss, epoch {epoch}" for epoch, _ in eager["valid_loss"]]
    rows = []
    for run in runs:
        name = f"{'compiled' if run['compiled'] else 'eager'} seed {run['seed']}"
        rows.append([name, f"{run['wps']:.0f}", f"{run['loss_at_end']:.3f}", f"{run['wall_s']:.0f}"])
        rows[-1] += [f"{loss:.3f}" for _, loss in run["valid_loss"]]
    print("\n".join(table(header, rows)))
    print(
        f"compiled / eager words/s: {ratio:.3f}; loss at the end {loss_change:+.2%}; {'; '.join(compiled['compile_log'])}"
    )
    write_results(args, argv, runs, ratio)


if __name__ == "__main__":
    with commands.exit_on_failure("compiled_train.py"):
        main()
