"""Translation quality on Multi30k: the plugin's variants (fairseq_realformer/variants.py, and
"fairseq", fairseq's own `transformer`) trained alike by the Multi30k recipe (examples/multi30k/
run.sh) with several seeds, scored on every test set, compared seed by seed (paired bootstrap)
and across seeds (exact permutation test), tabled and drawn. What the studies found: STUDY.md.

    nice -n 19 python studies/quality.py --preset cpu --seeds 1,2,3 --jobs 2 \\
        --json studies/results/cpu-quality-multi30k-en-de.json --figures docs/figures

More:
    python studies/quality.py --quick --seeds 1,2      # minutes on a CPU: proves the pipeline runs
    python studies/quality.py --preset cpu --lr 2e-3,4e-3,8e-3 --seeds 1 --best-seeds 2,3 ...
        # a sweep: every variant at every rate, then seeds 2 and 3 of each at its best rate on
        # validation BLEU (never a test set)
    python studies/quality.py --preset published --variants fairseq,post-ln-realformer ...
        # the literature's recipe (Wu et al. 2021, 41.02 BLEU), scored as it scores
    python studies/quality.py --preset cpu --report-only --json FILE    # train nothing: report
    python studies/quality.py ... --status    # the study's flags: each run's state, while it trains

Presets (every variant alike; --lr, --warmup, --epochs, --layers override them):
  cpu        4+4 layers, d=128, FFN 256, 4 heads, dropout 0.3, label smoothing 0.1; Adam peak lr
             2e-3 after 400 warm-up updates, linear decay to 0 at the end of epoch 20 (the
             RealFormer paper's NMT schedule); ~132 updates an epoch, ~100 s on 2 idle cores
  gpu        the recipe's model: 6+6 layers, 512/1024, Adam 5e-4, inverse-sqrt warm-up, 12 epochs
  published  lowercased Moses-tokenised text, joint BPE 10k, 4+4 layers, d=128, Adam 5e-3, 8,192
             tokens an update, at most 8,000 updates, patience 10; BLEU on the tokenised text
             (multi-bleu's), sacreBLEU and chrF case-insensitive on the detokenised output
  --quick    the recipe's --tiny mode (300 lines, width 32), 2+2 layers, 2 epochs

Stop it any time (Ctrl-C); the same command goes on: finished runs are skipped, a stopped one
resumes from its last epoch checkpoint, and the runs a --json file of the same settings holds
count as finished (a committed study goes on in a fresh checkout). Seed 1 of every variant runs
first. A run that diverges (studies/divergence.py) is stopped at once, recorded with its update
and never chosen as a best. --dropout-gap: a deep Post-LN can learn with dropout on and break
with it off. Folders: OUT/data (binarised once), OUT/VARIANT/seedS, with the flags given in its
name (OUT/VARIANT-lr0.002-layers18-bf16/seedS).

Environment: REALFORMER_RUNS=DIR keeps the work folders there (runs/NAME is DIR/NAME: set it to a
folder outside the checkout for a study that outlasts a session, and the same command in a fresh
clone resumes it); on a CPU every training gets glibc's allocator settings of common/allocator.py
(~1.35x faster, the same numbers), or none with REALFORMER_MALLOC=off.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import dataclasses
import sys
from collections import namedtuple
from pathlib import Path

from common import commands, multi30k_args
from common.host import host
from common.presets import PRESETS
from common.repo import RUNS, STOCK, work_folder
from studies import figures, recipe, scoring, status, supervise, tables
from studies.study import Study, StudyRecord

DEFAULT_VARIANTS = "post-ln,pre-ln,admin,realformer-sum,realformer"
# what the command asks of a study besides its settings: train nothing, and where to draw
Outputs = namedtuple("Outputs", "report_only figures beside status")
FLAGS = {  # each flag's argparse options, in --help's order
    "--out": dict(
        help="work folder (default: runs/quality-SRC-TGT-PRESET; runs/ is REALFORMER_RUNS when set: a folder "
        "that a fresh checkout keeps)"
    ),
    "--preset": dict(
        choices=("gpu", "cpu", "published"), default="gpu", help="model size and schedule (default: %(default)s)"
    ),
    "--quick": dict(action="store_true", help="the recipe's --tiny mode, 2+2 layers: minutes on a CPU"),
    "--seeds": dict(default="1", metavar="1,2,3", help="comma list of seeds (default: %(default)s)"),
    "--jobs": dict(
        type=int,
        default=1,
        metavar="N",
        help="trainings side by side, one thread each; studies side by side into one --out train N between "
        "them (default: 1)",
    ),
    "--epochs": dict(type=int, help="training epochs (default: the preset's)"),
    "--lr": dict(
        metavar="LR[,LR...]", help="peak learning rate (default: the preset's); several: a sweep, each its own runs"
    ),
    "--best-seeds": dict(
        metavar="2,3",
        dest="best_seeds_given",
        help="with several --lr: then train these seeds too, for each variant at the rate whose --seeds runs "
        "scored the best validation BLEU",
    ),
    "--widen": dict(
        action="store_true",
        help="with several --lr: where a variant's best rate is the lowest or the highest of them, also train "
        "its --seeds at half the lowest or twice the highest, and choose among the three (no variant loses "
        "for want of its rate)",
    ),
    "--best-variants": dict(
        metavar="A,B,...",
        help="with --best-seeds: only these of --variants get the further seeds (default: all; e.g. not the "
        "ones that do not train at this depth)",
    ),
    "--warmup": dict(type=int, metavar="UPDATES", help="learning-rate warm-up updates (default: the preset's)"),
    "--layers": dict(type=int, metavar="N", help="encoder and decoder layers (default: the preset's)"),
    "--bf16": dict(
        action="store_true",
        help="train and translate in bfloat16 mixed precision (the recipe's --bf16; folders VARIANT-bf16)",
    ),
    "--source-lang": dict(default="en", help="en, de, fr or cs (default: %(default)s)"),
    "--target-lang": dict(default="de", help="en, de, fr or cs (default: %(default)s)"),
    "--test-sets": dict(
        metavar="A,B,...", help="test sets of --data to score (default: every test_* set in both languages)"
    ),
    "--report-only": dict(action="store_true", help="train nothing: report the runs already finished"),
    "--status": dict(
        action="store_true",
        help="train and write nothing: every run of the study's plan with its state (finished, training, "
        "waiting, diverged), a training's epoch, speed and end, and the run trained next (studies/status.py)",
    ),
    "--dropout-gap": dict(
        action="store_true",
        help="score every finished run's kept checkpoints with dropout off and on (studies/dropout_gap.py)",
    ),
    "--figures": dict(metavar="DIR", help="draw the learning curves and the BLEU per seed into DIR"),
    "--beside": dict(
        metavar="JSON",
        help="a sweep's figure also draws this other sweep's lines, dashed (e.g. 4+4 beside 12+12 layers)",
    ),
    "--machine": dict(default=host(), help="the machine, for the figures' titles and the JSON (default: %(default)s)"),
}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, options in FLAGS.items():
        p.add_argument(flag, **options)
    multi30k_args.add(p, DEFAULT_VARIANTS, also=STOCK)
    return p


def comma_list(p, flag, given, expected, kind=int):
    """The comma list *given* for --*flag*, of *kind*; a one-line error naming the flag if it is not one."""
    try:
        return [kind(s.strip()) for s in given.split(",") if s.strip()]
    except ValueError:
        p.error(f"--{flag} {given}: expected {expected}")


def parse_args(argv=None):
    """The study the command line asks for, and its Outputs; one line naming the flag for what cannot work."""
    p = build_parser()
    args = p.parse_args(argv)
    multi30k_args.check(p, args, also=STOCK)
    if args.status and args.report_only:
        p.error("--status: not with --report-only (--status shows the runs' states and reports nothing)")
    seeds = sorted(set(comma_list(p, "seeds", args.seeds, "a comma list of integers, e.g. 1,2,3")))
    if not seeds:
        p.error("--seeds: give at least one seed")
    for flag, least in (("jobs", 1), ("epochs", 1), ("warmup", 0), ("layers", 1)):
        if (value := getattr(args, flag)) is not None and value < least:
            p.error(f"--{flag} {value}: must be at least {least}")
    if args.quick and args.preset == "published":  # run.sh: --tiny and --published exclude each other
        p.error("--quick: the published recipe has no tiny form; drop --quick, or use --preset cpu")
    preset_name = "quick" if args.quick else args.preset
    lrs = [PRESETS[preset_name].lr]
    if args.lr is not None:
        lrs = comma_list(p, "lr", args.lr, "a number or a comma list of numbers, e.g. 1e-3,2e-3", float)
        if any(lr <= 0 for lr in lrs) or len(set(lrs)) != len(lrs):
            p.error(f"--lr {args.lr}: learning rates must be positive and different")
    if args.widen and len(lrs) < 2:
        p.error("--widen: needs several --lr to widen")
    if args.best_variants is not None and args.best_seeds_given is None:
        p.error("--best-variants: only with --best-seeds")
    best_seeds, best_variants = [], None
    if args.best_seeds_given is not None:
        given = comma_list(p, "best-seeds", args.best_seeds_given, "a comma list of integers, e.g. 2,3")
        best_seeds = sorted(set(given))
        if len(lrs) < 2:
            p.error("--best-seeds: needs several --lr to choose from")
        if args.best_variants is not None:
            best_variants = comma_list(p, "best-variants", args.best_variants, "names", str)
            unknown = [v for v in best_variants if v not in args.variants]
            if unknown or not best_variants:
                p.error(f"--best-variants {','.join(unknown)}: give some of --variants ({','.join(args.variants)})")
        if set(best_seeds) & set(seeds):
            already = ",".join(map(str, seeds))
            p.error(f"--best-seeds {args.best_seeds_given}: the sweep's --seeds already train {already}")
    pair = f"{args.source_lang}-{args.target_lang}"
    as_given = "variants data widen bf16 source_lang target_lang test_sets jobs json machine dropout_gap".split()
    study = Study(
        preset_name=preset_name,
        seeds=seeds,
        lrs=lrs,
        out=work_folder(args.out or RUNS / f"quality-{pair}-{preset_name}"),
        overrides={k: getattr(args, k) for k in ("warmup", "epochs", "layers") if getattr(args, k) is not None},
        lr_given=args.lr is not None,
        best_seeds=best_seeds,
        best_variants=best_variants,
        **{name: getattr(args, name) for name in as_given},
    )
    return study, Outputs(args.report_only, args.figures, args.beside, args.status)


def main(argv=None):
    study, outputs = parse_args(argv)
    # the flags, for the JSON's command: the one that trains the study (--report-only only reports it)
    given = [flag for flag in (sys.argv[1:] if argv is None else argv) if flag != "--report-only"]
    previous = study.previous()
    if outputs.status:  # reads the run folders and the --json, writes nothing
        print(status.table(study, previous))
        return
    study = dataclasses.replace(study, machine=study.machines(previous, outputs.report_only))
    if outputs.report_only:
        if not (study.out / "data" / "bin").exists() and not study.record(previous).runs:
            raise SystemExit(
                f"quality.py: error: --report-only: {study.out} holds no study (no {study.out / 'data' / 'bin'})"
            )
        if study.preset.recipe:  # the published recipe's comparisons read its tokenised references: prepared again
            recipe.prepare_data(study)
    else:
        data_dir = recipe.prepare_data(study)
        so_far = (lambda record: report_so_far(study, outputs, given, record)) if study.json else None
        supervise.run_all(study, data_dir, previous, so_far)
    report(study, outputs, given, study.record(previous))


def report_so_far(study, outputs, given, record):
    """The report and --json after a run finished, while others train: a study of many sessions
    keeps (and can commit) every run as it finishes. Its failure stops no training."""
    try:  # the tables are printed once, at the end (not by hiding stdout: the runs' threads print there)
        report(study, outputs, given, record, show=False)
        supervise.say(f"the finished runs so far are in {study.json}")
    except (Exception, SystemExit) as e:
        supervise.say(f"the report so far failed ({e}); the runs go on")


def report(study, outputs, given, record, show=True):
    """The tables (*show*), the figures and --json of the study's *record* (Study.record)."""
    if not record.runs:
        raise SystemExit(f"quality.py: error: no finished run in {study.out} yet")
    found, across_seeds = scoring.comparisons(record.scored), scoring.seed_comparisons(record.scored)
    if study.sweep and show:
        print(tables.sweep_table(record), flush=True)
    if record.compared and show:  # in a sweep: each variant at its best rate
        best = "Each variant at its best peak learning rate (chosen on validation BLEU)"
        print(tables.table(record, best if study.sweep else record.what, found, across_seeds), flush=True)
    if outputs.figures:
        paths = draw(study, outputs, record)
        if show:
            print("\n".join(f"[quality] figure: {path}" for path in paths))
    if study.json:
        study.save(given, record, found, across_seeds, show)


def draw(study, outputs, record):
    """The paths of the sweep's figure (--beside another depth's) and those of each variant at its best rate."""
    stem = Path(study.json).stem if study.json else f"quality-{study.pair}-{study.preset_name}"
    folder, paths = Path(outputs.figures), []
    if study.sweep:
        beside = StudyRecord.load(outputs.beside, study.data) if outputs.beside else None
        paths.append(figures.sweep_figure(record, folder, stem, beside))
    if record.scored:
        paths += figures.figures(record, folder, stem + ("-best" if study.sweep else ""))
    return paths


if __name__ == "__main__":
    with commands.exit_on_failure("quality.py"):
        main()
