"""Translation quality on real data: Multi30k, one table of test BLEU, a column per test set.

Post-LN, Pre-LN, ADMIN (profiled ω) and RealFormer on ADMIN (sum, and mean: "realformer") are
trained with the same data, seed and budget by the Multi30k recipe (examples/multi30k/run.sh:
joint sentencepiece, fairseq-train, average of the last epoch checkpoints, beam 5, sacreBLEU on
each test set). The variants are those of fairseq_realformer/variants.py. Any two of en, de, fr,
cs (default en→de); by default every test set of --data in both languages.
The data are prepared once and shared by every variant; a re-run skips finished variants.

    python benchmarks/quality.py --data ../shared/data/multi30k            # one GPU, ~10 min
    python benchmarks/quality.py --data ../shared/data/multi30k --quick    # CPU: proves it runs
    python benchmarks/quality.py --source-lang de --target-lang en --test-sets test_2016_flickr,test_2017_flickr --layers 12

--quick uses the recipe's --tiny mode (first 300 lines, width 32, 2 epochs) with 2+2 layers: its
BLEU says the pipeline works, not which model is better.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import multi30k_args  # noqa: E402
from multi30k_args import REPO, VARIANTS  # noqa: E402

RECIPE = REPO / "examples" / "multi30k" / "run.sh"
DEFAULT_VARIANTS = "post-ln,pre-ln,admin,realformer-sum,realformer"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="work folder (default: runs/quality-SRC-TGT, or runs/quality-SRC-TGT-quick)")
    p.add_argument("--quick", action="store_true", help="the recipe's --tiny mode, 2+2 layers: minutes on a CPU")
    p.add_argument("--epochs", type=int, help="training epochs (default: 12; --quick: 2)")
    p.add_argument("--source-lang", default="en", help="en, de, fr or cs (default: %(default)s)")
    p.add_argument("--target-lang", default="de", help="en, de, fr or cs (default: %(default)s)")
    p.add_argument("--test-sets", metavar="A,B,...",
                   help="test sets of --data to score (default: every test_* set in both languages)")
    p.add_argument("--layers", type=int, metavar="N",
                   help="encoder and decoder layers (default: the recipe's 6; --quick: 2)")
    multi30k_args.add(p, DEFAULT_VARIANTS)
    args = p.parse_args()
    multi30k_args.check(p, args)
    pair = f"{args.source_lang}-{args.target_lang}"
    args.out = Path(args.out or REPO / "runs" / f"quality-{pair}{'-quick' if args.quick else ''}")
    args.epochs = args.epochs or (2 if args.quick else 12)
    args.layers = args.layers or (2 if args.quick else None)
    if args.layers is not None and args.layers < 1:
        p.error("--layers must be at least 1")
    return args


def finished_test_sets(run_dir):
    """The test sets a finished recipe run scored, in its order; None while it is not finished."""
    listed = run_dir / "test-sets"  # written by the recipe
    if not listed.exists():
        return None
    names = listed.read_text().strip().split(",")
    return names if all((run_dir / "score" / name / "scores.json").exists() for name in names) else None


def run_variant(args, variant, shared_bin):
    run_dir = args.out / variant
    names = finished_test_sets(run_dir)
    if names is None or (args.test_sets and names != args.test_sets.split(",")):
        run_dir.mkdir(parents=True, exist_ok=True)
        if shared_bin is not None and not (run_dir / "bin").exists():
            (run_dir / "bin").symlink_to(shared_bin.resolve())  # same data for every variant
        recipe_flags = ["--source-lang", args.source_lang, "--target-lang", args.target_lang]
        recipe_flags += ["--test-sets", args.test_sets] if args.test_sets else []
        depth = ["--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers)] if args.layers else []
        cmd = ["bash", str(RECIPE), *(["--tiny"] if args.quick else []), *recipe_flags, args.data, str(run_dir),
               "--", *VARIANTS[variant], *depth]  # fmt: skip
        print(f"[quality] {variant}: {' '.join(cmd)}", flush=True)
        start = time.time()
        env = dict(os.environ, EPOCHS=str(args.epochs))
        log_path = run_dir / "recipe.log"
        with open(log_path, "a") as log:
            if subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                errors = [line for line in log_path.read_text().splitlines() if line.startswith("run.sh: error: ")]
                reason = errors[-1][len("run.sh: error: "):] if errors else f"{variant} failed; see {log_path}"
                raise SystemExit(f"quality.py: error: {reason}")
        (run_dir / "wall_s").write_text(f"{time.time() - start:.0f}\n")
        names = finished_test_sets(run_dir)
    scores = {}
    for name in names:
        result = json.loads((run_dir / "score" / name / "scores.json").read_text())
        scores[name] = {"sacrebleu": result["sacrebleu"], "signature": result["sacrebleu_signature"]}
    print(f"[quality] {variant}: " + ", ".join(f"{name} sacreBLEU {s['sacrebleu']:.2f}" for name, s in scores.items()), flush=True)
    wall = run_dir / "wall_s"
    return {"variant": variant, "test_sets": scores, "wall_s": float(wall.read_text()) if wall.exists() else None}


def main():
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results, shared_bin = [], None
    for variant in args.variants:
        results.append(run_variant(args, variant, shared_bin))
        shared_bin = shared_bin or args.out / variant / "bin"
    names = list(results[0]["test_sets"])
    size = f"{args.layers}+{args.layers} layers" if args.layers else "the recipe's depth"
    lines = [f"Multi30k {args.source_lang}→{args.target_lang}, sacreBLEU per test set; "
             f"{'--quick (recipe --tiny), ' if args.quick else ''}{size}, {args.epochs} epochs, seed 1; "
             f"average of the last epoch checkpoints, beam 5", "",
             f"| variant | {' | '.join(names)} | wall (s) |", "|---" * (len(names) + 2) + "|"]  # fmt: skip
    for r in results:
        bleu = [f"{score['sacrebleu']:.2f}" for score in r["test_sets"].values()]
        lines.append(f"| {r['variant']} | {' | '.join(bleu)} | {r['wall_s'] or '—'} |")
    lines += ["", f"sacreBLEU signature: {results[0]['test_sets'][names[0]]['signature']}"]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
