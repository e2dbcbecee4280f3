"""Translation quality on real data: Multi30k En→De, one table of test BLEU.

Post-LN, Pre-LN, ADMIN (profiled ω) and RealFormer on ADMIN (sum, and mean: "realformer") are
trained with the same data, seed and budget by the Multi30k recipe (examples/multi30k/run.sh:
joint sentencepiece, fairseq-train, average of the last epoch checkpoints, beam 5, sacreBLEU on
test_2016_flickr). The variants are those of fairseq_realformer/variants.py.
The data are prepared once and shared by every variant; a re-run skips finished variants.

    python benchmarks/quality.py --data ../shared/data/multi30k            # one GPU, ~10 min
    python benchmarks/quality.py --data ../shared/data/multi30k --quick    # CPU: proves it runs

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
    p.add_argument("--out", help="work folder (default: runs/quality, or runs/quality-quick)")
    p.add_argument("--quick", action="store_true", help="the recipe's --tiny mode, 2+2 layers: minutes on a CPU")
    p.add_argument("--epochs", type=int, help="training epochs (default: 12; --quick: 2)")
    multi30k_args.add(p, DEFAULT_VARIANTS)
    args = p.parse_args()
    multi30k_args.check(p, args)
    args.out = Path(args.out or REPO / "runs" / ("quality-quick" if args.quick else "quality"))
    args.epochs = args.epochs or (2 if args.quick else 12)
    return args


def run_variant(args, variant, shared_bin):
    run_dir = args.out / variant
    scores = run_dir / "score" / "scores.json"
    if not scores.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        if shared_bin is not None and not (run_dir / "bin").exists():
            (run_dir / "bin").symlink_to(shared_bin.resolve())  # same data for every variant
        depth = ["--encoder-layers", "2", "--decoder-layers", "2"] if args.quick else []
        cmd = ["bash", str(RECIPE), *(["--tiny"] if args.quick else []), args.data, str(run_dir), "--", *VARIANTS[variant], *depth]
        print(f"[quality] {variant}: {' '.join(cmd)}", flush=True)
        start = time.time()
        env = dict(os.environ, EPOCHS=str(args.epochs))
        with open(run_dir / "recipe.log", "a") as log:
            if subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"quality.py: error: {variant} failed; see {run_dir / 'recipe.log'}")
        (run_dir / "wall_s").write_text(f"{time.time() - start:.0f}\n")
    result = json.loads(scores.read_text())
    print(f"[quality] {variant}: sacreBLEU {result['sacrebleu']:.2f}", flush=True)
    wall = run_dir / "wall_s"
    return {"variant": variant, "sacrebleu": result["sacrebleu"], "signature": result["sacrebleu_signature"],
            "wall_s": float(wall.read_text()) if wall.exists() else None}  # fmt: skip


def main():
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results, shared_bin = [], None
    for variant in args.variants:
        results.append(run_variant(args, variant, shared_bin))
        shared_bin = shared_bin or args.out / variant / "bin"
    lines = [f"Multi30k En→De, test_2016_flickr; {'--quick (recipe --tiny, 2+2 layers)' if args.quick else 'recipe defaults'}, "
             f"{args.epochs} epochs, seed 1; average of the last epoch checkpoints, beam 5", "",
             "| variant | sacreBLEU | wall (s) |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {r['variant']} | {r['sacrebleu']:.2f} | {r['wall_s'] or '—'} |" for r in results]
    lines += ["", f"sacreBLEU signature: {results[0]['signature']}"]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
