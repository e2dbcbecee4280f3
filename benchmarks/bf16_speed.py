"""bf16 against float32 as a user sees it: fairseq-train's own tokens/s (``wps``) and peak memory,
and fairseq-generate's sentences/s with beam 5, for the same models, data and flags, run side by
side on this machine (float32 and bf16 alternate, each repeat in a fresh process).

    python benchmarks/bf16_speed.py --json benchmarks/results/cpu-bf16-speed.json
    python benchmarks/bf16_speed.py --quick          # a minute: proves it runs
    python benchmarks/bf16_speed.py --decode-only --threads 1 --models small-transformer,small-realformer

Models (``--models``; bf16_decode_speed.MODELS):
  wmt-transformer   fairseq's transformer_wmt_en_de, 6L-6L, d=512 (FFN 2048, 8 heads)
  wmt-realformer    realformer_wmt_en_de (RealFormer on ADMIN, all paths, running mean), 6L-6L, d=512
  small-transformer fairseq's transformer at the quality study's size: 4+4, d=128, FFN 256, 4 heads
  small-realformer  realformer (the study's "realformer" variant) at that size
all with shared embeddings on Multi30k En-De (joint sentencepiece, 8k: the quality study's data,
binarised by examples/multi30k/run.sh --prepare-only), dropout 0.3, Adam, label smoothing 0.1,
--max-tokens 4096 (2048 at d=512). Training: --max-update N, the first logging interval is
warm-up and is left out of the tokens/s. Memory: the peak resident set of the fairseq-train
process (ru_maxrss), the model and data included. Generation: fairseq-generate translates about
--gen-sentences of the test set (one shard) with beam 5 from the checkpoint the first float32
training run wrote, every hypothesis forced to 24 tokens (--min-len 24 --max-len-b 24): an
untrained model would stop after one token, and a forced length makes both precisions decode the
same steps.

--decode-only times the beam search alone, in one process, without data or training:
benchmarks/bf16_decode_speed.py.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # this checkout: its packages, first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    safe = ["-P"] if sys.version_info >= (3, 11) else []  # -P: no package of the folder it runs in (another checkout)
    os.execve(sys.executable, [sys.executable, *safe, "-m", "benchmarks.bf16_speed", *sys.argv[1:]], env)

import argparse
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

from benchmarks import bench, bf16_decode_speed
from benchmarks.bench import say
from benchmarks.bf16_decode_speed import DECODE_VOCAB, GEN_LENGTH, MODELS
from common import allocator, commands
from common.host import host
from common.repo import MULTI30K, USER_DIR, VENV
from common.results import write_result

TEST_SENTENCES = 1000  # test_2016_flickr
TRAIN = (
    "--user-dir",
    str(USER_DIR),
    *"--source-lang en --target-lang de --share-all-embeddings --dropout 0.3 --optimizer adam "
    "--adam-betas (0.9,0.98) --lr 1e-3 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "
    "--seed 1 --num-workers 0 --log-format json --no-progress-bar --disable-validation "
    "--no-epoch-checkpoints --save-interval-updates 1000000".split(),
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma list of %(default)s")
    p.add_argument("--updates", type=int, default=40, help="training updates per run (default: %(default)s)")
    p.add_argument("--log-interval", type=int, default=10, help="updates per wps line (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="float32/bf16 pairs per model (default: %(default)s)")
    p.add_argument("--gen-sentences", type=int, default=200, help="test sentences translated (default: %(default)s)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP threads (default: every core)")
    p.add_argument("--quick", action="store_true", help="small models, 12 updates, 1 repeat, 40 sentences")
    p.add_argument(
        "--decode-only",
        action="store_true",
        help="time beam decoding alone in this process, random weights and sources (bf16_decode_speed.py); "
        "--repeats, --gen-sentences and --threads apply",
    )
    p.add_argument("--data", default=str(MULTI30K), help="Multi30k folder")
    p.add_argument("--out", help="work folder (default: runs/bf16-speed; runs/ is REALFORMER_RUNS when set)")
    p.add_argument("--machine", default=host())
    p.add_argument("--json", help="also write the numbers here")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.updates, args.log_interval = "small-transformer,small-realformer", 12, 4
        args.repeats, args.gen_sentences = 1, 40
    bench.check_training_args(p, args, MODELS, "bf16-speed")
    return args


def cpu_flags(precision):
    return ["--cpu", *(["--bf16"] if precision == "bf16" else [])]


def run_on_threads(cmd, args, log_path):
    """*cmd* run on --threads: what it left (its output, its peak resident set)."""
    env = allocator.environment(dict(os.environ, OMP_NUM_THREADS=str(args.threads)), cpu=True)
    return commands.run(cmd, log_path, env=env)


def train(args, data, model, precision, repeat):
    work = args.out / f"{model}-{precision}-{repeat}"
    work.mkdir(parents=True, exist_ok=True)
    cmd = [str(VENV / "bin" / "fairseq-train"), str(data), *TRAIN, *MODELS[model], "--max-update", str(args.updates)]
    cmd += ["--log-interval", str(args.log_interval), "--save-dir", str(work / "ckpt"), *cpu_flags(precision)]
    run = run_on_threads(cmd, args, work / "train.log")
    return {
        "tokens_per_s": round(bench.timed_words_per_s(run.output), 1),
        "peak_rss_mb": round(run.peak_rss / 2**20, 1),
        "checkpoint": str(work / "ckpt" / "checkpoint_last.pt"),
        "command": shlex.join(cmd),
    }


def generate(args, data, checkpoint, precision, work):
    cmd = [str(VENV / "bin" / "fairseq-generate"), str(data), "--user-dir", str(USER_DIR), "--path", checkpoint]
    cmd += "--source-lang en --target-lang de --gen-subset test --beam 5 --batch-size 64 --max-len-a 0".split()
    cmd += ["--min-len", str(GEN_LENGTH), "--max-len-b", str(GEN_LENGTH)]
    # one shard of the 1,000-sentence test set (fairseq-generate shards by "rank")
    cmd += ["--distributed-world-size", str(max(1, TEST_SENTENCES // args.gen_sentences)), "--distributed-rank", "0"]
    output = run_on_threads([*cmd, *cpu_flags(precision)], args, work / f"generate-{precision}.log").output
    match = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s", output)
    if not match:
        raise SystemExit(f"bf16_speed.py: error: no timing line in {work / f'generate-{precision}.log'}")
    sentences, tokens, seconds, _ = match.groups()
    return {
        "sentences": int(sentences.replace(",", "")),
        "tokens": int(tokens.replace(",", "")),
        "sentences_per_s": round(int(sentences.replace(",", "")) / float(seconds), 2),
    }


def measure(args, data, model):
    runs = {"fp32": [], "bf16": []}
    for repeat in range(args.repeats):
        for precision in ("fp32", "bf16") if repeat % 2 == 0 else ("bf16", "fp32"):  # alternate the order
            result = train(args, data, model, precision, repeat)
            speed = f"{result['tokens_per_s']:.0f} tokens/s, peak {result['peak_rss_mb']:.0f} MB"
            say("bf16-speed", f"{model} {precision} #{repeat + 1}: {speed}")
            runs[precision].append(result)
    checkpoint = runs["fp32"][0]["checkpoint"]  # the same weights translated both ways
    work = Path(checkpoint).parent.parent
    generation = {}
    for precision in ("fp32", "bf16", "fp32", "bf16")[: 2 * args.repeats]:
        generation.setdefault(precision, []).append(generate(args, data, checkpoint, precision, work))
    summary = {}
    for precision in ("fp32", "bf16"):
        summary[precision] = {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[precision]),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs[precision]),
            "gen_sentences_per_s": statistics.median(g["sentences_per_s"] for g in generation[precision]),
            "gen_tokens": generation[precision][0]["tokens"],
            "train_runs": [{k: v for k, v in r.items() if k != "checkpoint"} for r in runs[precision]],
            "generate_runs": generation[precision],
        }
    fp32, bf16 = summary["fp32"], summary["bf16"]
    summary["ratio"] = {
        "train_tokens_per_s": round(bf16["tokens_per_s"] / fp32["tokens_per_s"], 2),
        "train_tokens_per_s_paired": round(
            statistics.median(b["tokens_per_s"] / f["tokens_per_s"] for f, b in zip(runs["fp32"], runs["bf16"])), 2
        ),
        "gen_sentences_per_s": round(bf16["gen_sentences_per_s"] / fp32["gen_sentences_per_s"], 2),
        "peak_rss": round(bf16["peak_rss_mb"] / fp32["peak_rss_mb"], 2),
    }
    return summary


def report(results):
    rows = [
        "| model | training tokens/s fp32 | bf16 | × | paired × | beam-5 sentences/s fp32 | bf16 | × "
        "| peak RSS MB fp32 | bf16 | × |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, r in results.items():
        f, b, x = r["fp32"], r["bf16"], r["ratio"]
        rows.append(
            f"| {model} | {f['tokens_per_s']:.0f} | {b['tokens_per_s']:.0f} | {x['train_tokens_per_s']:.2f} | "
            f"{x['train_tokens_per_s_paired']:.2f} | {f['gen_sentences_per_s']:.1f} | {b['gen_sentences_per_s']:.1f} | "
            f"{x['gen_sentences_per_s']:.2f} | {f['peak_rss_mb']:.0f} | {b['peak_rss_mb']:.0f} | {x['peak_rss']:.2f} |"
        )
    return "\n".join(rows)


def write_json(args, argv, what, **fields):
    """The numbers in --json, after what was measured, the header, the CPU's bf16 units and threads."""
    import torch

    units = bool(torch.cpu._is_avx512_bf16_supported())
    write_result(
        args.json, __file__, argv, args.machine, what=what, cpu_bf16_units=units, threads=args.threads, **fields
    )
    print(f"[bf16-speed] wrote {args.json}")


def main(argv=None):
    args = parse_args(argv)
    if args.decode_only:
        results = bf16_decode_speed.measure_all(args)
        if args.json:
            write_json(
                args,
                argv,
                "beam-5 decoding alone, bf16 autocast against float32, alternating in one process: random weights "
                "and sources, every hypothesis forced to the same length (bf16_speed.py --decode-only)",
                repeats=args.repeats,
                gen_sentences=args.gen_sentences,
                gen_length=GEN_LENGTH,
                vocabulary=DECODE_VOCAB,
                results=results,
            )
        return
    data = bench.prepare_multi30k(args.data, args.out, "bf16-speed")
    results = {model: measure(args, data, model) for model in args.models}
    print(report(results), flush=True)
    if args.json:
        write_json(
            args,
            argv,
            "bf16 mixed precision (--bf16) against float32: fairseq-train's tokens/s and peak RSS, "
            "fairseq-generate beam 5 sentences/s, Multi30k En-De, on a CPU",
            updates=args.updates,
            log_interval=args.log_interval,
            repeats=args.repeats,
            gen_sentences=args.gen_sentences,
            results=results,
        )


if __name__ == "__main__":
    with commands.exit_on_failure("bf16_speed.py"):
        main()
