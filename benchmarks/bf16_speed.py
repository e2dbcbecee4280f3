"""bf16 against float32 as a user sees it: fairseq-train's own tokens/s (``wps``) and peak memory,
and fairseq-generate's sentences/s with beam 5, for the same models, data and flags, float32 and
bf16 alternating, each repeat in a fresh process.

    python benchmarks/bf16_speed.py --json benchmarks/results/cpu-bf16-speed.json
    python benchmarks/bf16_speed.py --quick          # a minute: proves it runs
    python benchmarks/bf16_speed.py --decode-only --threads 1 --models small-transformer,small-realformer

Models (``--models``):
  wmt-transformer   fairseq's transformer_wmt_en_de, 6L-6L, d=512 (FFN 2048, 8 heads)
  wmt-realformer    realformer_wmt_en_de (RealFormer on ADMIN, all paths, running mean), 6L-6L, d=512
  small-transformer fairseq's transformer at the quality study's size: 4+4, d=128, FFN 256, 4 heads
  small-realformer  realformer (the study's "realformer" variant) at that size
all with shared embeddings on the quality study's Multi30k En-De (joint sentencepiece 8k), dropout
0.3, Adam, label smoothing 0.1, --max-tokens 4096 (2048 at d=512). Training: --max-update N; the
first logging interval is warm-up, left out of the tokens/s. Memory: the fairseq-train process's
peak resident set (ru_maxrss). Generation: about --gen-sentences of the test set (one shard), beam
5, from the first float32 run's checkpoint, every hypothesis forced to 24 tokens (an untrained
model would stop after one; a forced length makes both precisions decode the same steps).

--decode-only times the beam search alone, in this process, without data or training: random
weights (ω profiled on one random batch, as speed.py's), a dictionary of Multi30k's size,
--gen-sentences random sources of 8-20 tokens as one batch, fairseq's SequenceGenerator (beam 5,
24 tokens), --repeats times in float32 and under the bf16 autocast (as fairseq-generate --bf16),
alternating and swapping the order each repeat; each precision's median sentences/s and the median
(and range) of the per-repeat ratios bf16 / float32.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import contextlib
import os
import re
import shlex
import statistics
import time
from pathlib import Path

import torch

from benchmarks import bench
from benchmarks.bench import say
from common import allocator, commands
from common.presets import PRESETS
from common.repo import USER_DIR, VARIANTS
from common.results import write_result

SMALL = tuple(PRESETS["cpu"].model_flags())  # the quality study's model (--preset cpu): 4+4 layers, d=128
MODELS = {
    "wmt-transformer": ("--arch", "transformer_wmt_en_de", "--max-tokens", "2048"),
    "wmt-realformer": ("--arch", "realformer_wmt_en_de", "--max-tokens", "2048"),
    "small-transformer": ("--arch", "transformer", *SMALL, "--max-tokens", "4096"),
    "small-realformer": ("--arch", "realformer_iwslt_de_en", *SMALL, *VARIANTS["realformer"], "--max-tokens", "4096"),
}
GEN_LENGTH = 24  # every hypothesis: about a Multi30k sentence's length in pieces
DECODE_VOCAB = 7792  # the joint sentencepiece dictionary of Multi30k (examples/multi30k/run.sh), specials included
TEST_SENTENCES = 1000  # test_2016_flickr
PRECISIONS = ("fp32", "bf16")
TRAIN = (*bench.MULTI30K_TRAINING, *"--lr 1e-3 --no-epoch-checkpoints --save-interval-updates 1000000".split())


def parse_args(argv=None):
    p = bench.training_parser(__doc__, MODELS, "bf16-speed", updates=40)
    p.add_argument("--repeats", type=int, default=2, help="float32/bf16 pairs per model (default: %(default)s)")
    p.add_argument("--gen-sentences", type=int, default=200, help="test sentences translated (default: %(default)s)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP threads (default: every core)")
    p.add_argument("--quick", action="store_true", help="small models, 12 updates, 1 repeat, 40 sentences")
    p.add_argument(
        "--decode-only",
        action="store_true",
        help="time beam decoding alone in this process, random weights and sources; "
        "--repeats, --gen-sentences and --threads apply",
    )
    quick = {"models": "small-transformer,small-realformer", "updates": 12, "log_interval": 4}
    return bench.training_args(p, argv, MODELS, {**quick, "repeats": 1, "gen_sentences": 40})


def cpu_flags(precision):
    return ["--cpu", *(["--bf16"] if precision == "bf16" else [])]


def run_on_threads(cmd, args, log_path):
    """*cmd* run on --threads: what it left (its output, its peak resident set)."""
    env = allocator.environment(dict(os.environ, OMP_NUM_THREADS=str(args.threads)), cpu=True)
    return commands.run(cmd, log_path, env=env)


def train(args, data, model, precision, repeat):
    work = args.out / f"{model}-{precision}-{repeat}"
    work.mkdir(parents=True, exist_ok=True)
    cmd = [bench.fairseq_program("fairseq-train"), str(data), *TRAIN, *MODELS[model], "--max-update", str(args.updates)]
    cmd += ["--log-interval", str(args.log_interval), "--save-dir", str(work / "ckpt"), *cpu_flags(precision)]
    run = run_on_threads(cmd, args, work / "train.log")
    return {
        "tokens_per_s": round(bench.timed_words_per_s(run.output), 1),
        "peak_rss_mb": round(run.peak_rss / 2**20, 1),
        "checkpoint": str(work / "ckpt" / "checkpoint_last.pt"),
        "command": shlex.join(cmd),
    }


def generate(args, data, checkpoint, precision, work):
    cmd = [bench.fairseq_program("fairseq-generate"), str(data), "--user-dir", str(USER_DIR), "--path", checkpoint]
    cmd += "--source-lang en --target-lang de --gen-subset test --beam 5 --batch-size 64 --max-len-a 0".split()
    cmd += ["--min-len", str(GEN_LENGTH), "--max-len-b", str(GEN_LENGTH)]
    # one shard of the 1,000-sentence test set (fairseq-generate shards by "rank")
    cmd += ["--distributed-world-size", str(max(1, TEST_SENTENCES // args.gen_sentences)), "--distributed-rank", "0"]
    log = work / f"generate-{precision}.log"
    output = run_on_threads([*cmd, *cpu_flags(precision)], args, log).output
    match = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s", output)
    if not match:
        raise SystemExit(f"bf16_speed.py: error: no timing line in {log}")
    sentences, tokens = (int(n.replace(",", "")) for n in match.groups()[:2])
    return {"sentences": sentences, "tokens": tokens, "sentences_per_s": round(sentences / float(match[3]), 2)}


def measure(args, data, model):
    runs = {precision: [] for precision in PRECISIONS}
    for repeat in range(args.repeats):
        for precision in bench.in_turn(PRECISIONS, repeat):
            result = train(args, data, model, precision, repeat)
            speed = f"{result['tokens_per_s']:.0f} tokens/s, peak {result['peak_rss_mb']:.0f} MB"
            say("bf16-speed", f"{model} {precision} #{repeat + 1}: {speed}")
            runs[precision].append(result)
    checkpoint = runs["fp32"][0]["checkpoint"]  # the same weights translated both ways
    generation = {precision: [] for precision in PRECISIONS}
    for precision in (PRECISIONS * 2)[: 2 * args.repeats]:
        generation[precision].append(generate(args, data, checkpoint, precision, Path(checkpoint).parent.parent))
    summary = {
        precision: {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[precision]),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs[precision]),
            "gen_sentences_per_s": statistics.median(g["sentences_per_s"] for g in generation[precision]),
            "gen_tokens": generation[precision][0]["tokens"],
            "train_runs": [{k: v for k, v in r.items() if k != "checkpoint"} for r in runs[precision]],
            "generate_runs": generation[precision],
        }
        for precision in PRECISIONS
    }
    fp32, bf16 = summary["fp32"], summary["bf16"]
    paired = statistics.median(b["tokens_per_s"] / f["tokens_per_s"] for f, b in zip(runs["fp32"], runs["bf16"]))
    summary["ratio"] = {
        "train_tokens_per_s": round(bf16["tokens_per_s"] / fp32["tokens_per_s"], 2),
        "train_tokens_per_s_paired": round(paired, 2),
        "gen_sentences_per_s": round(bf16["gen_sentences_per_s"] / fp32["gen_sentences_per_s"], 2),
        "peak_rss": round(bf16["peak_rss_mb"] / fp32["peak_rss_mb"], 2),
    }
    return summary


def report(results):
    header = ["model", "training tokens/s fp32", "bf16", "×", "paired ×", "beam-5 sentences/s fp32", "bf16", "×"]
    rows = []
    for model, r in results.items():
        f, b, x = r["fp32"], r["bf16"], r["ratio"]
        row = [model, f"{f['tokens_per_s']:.0f}", f"{b['tokens_per_s']:.0f}", f"{x['train_tokens_per_s']:.2f}"]
        row += [f"{x['train_tokens_per_s_paired']:.2f}", f"{f['gen_sentences_per_s']:.1f}"]
        row += [f"{b['gen_sentences_per_s']:.1f}", f"{x['gen_sentences_per_s']:.2f}"]
        rows.append([*row, f"{f['peak_rss_mb']:.0f}", f"{b['peak_rss_mb']:.0f}", f"{x['peak_rss']:.2f}"])
    return "\n".join(bench.table([*header, "peak RSS MB fp32", "bf16", "×"], rows))


def decode_sample(dictionary, sentences, seed=1):
    """Random left-padded sources of 8-20 tokens (EOS last), as fairseq's collater shapes them
    (bench.batch's are of one length)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 21, (sentences,), generator=g)
    src = torch.full((sentences, int(lengths.max())), dictionary.pad())
    for i, n in enumerate(lengths.tolist()):
        src[i, src.size(1) - n :] = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=g)
        src[i, -1] = dictionary.eos()
    return {"net_input": {"src_tokens": src, "src_lengths": lengths}}


def decode_speed(args, model):
    """Beam-5 sentences/s of *model* with random weights, float32 and bf16 autocast alternating."""
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_realformer.modules import admin
    from fairseq_realformer.optim import precision

    flags = (*MODELS[model], "--dropout", "0.3")  # its --arch, and its layers where not the WMT arch's 6
    built, dictionary = bench.build("fairseq", 6, "cpu", torch.float32, flags, DECODE_VOCAB)
    admin.initialize(built, bench.batch(dictionary, 64, 16, "cpu", seed=5)["net_input"])  # nothing without ADMIN
    built.eval()
    sample = decode_sample(dictionary, args.gen_sentences)
    generator = SequenceGenerator(
        [built], dictionary, beam_size=5, max_len_a=0, max_len_b=GEN_LENGTH, min_len=GEN_LENGTH
    )

    def sentences_per_s(precision_name):
        bf16 = precision_name == "bf16"
        with torch.no_grad(), precision.autocast("cpu") if bf16 else contextlib.nullcontext():
            start = time.perf_counter()
            hypos = generator.forward(sample)
            seconds = time.perf_counter() - start
        assert all(len(h[0]["tokens"]) == GEN_LENGTH + 1 for h in hypos)  # the same steps: length + EOS
        return args.gen_sentences / seconds

    runs = {precision_name: [] for precision_name in PRECISIONS}
    for precision_name in runs:  # warm-up: allocator, lazy initialisation, the autocast's first casts
        sentences_per_s(precision_name)
    for repeat in range(args.repeats):
        for precision_name in bench.in_turn(PRECISIONS, repeat):
            runs[precision_name].append(sentences_per_s(precision_name))
    ratios = [b / f for f, b in zip(runs["fp32"], runs["bf16"])]
    say("bf16-speed", f"{model}: bf16/fp32 {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
    speeds = {
        name: {**median_range(xs, 2, "sentences_per_s"), "runs": [round(x, 2) for x in xs]} for name, xs in runs.items()
    }
    return {**speeds, "ratio_paired": median_range(ratios, 3)}


def median_range(xs, digits, median="median"):
    return {median: round(statistics.median(xs), digits), "min": round(min(xs), digits), "max": round(max(xs), digits)}


def decode_report(results):
    rows = []
    for model, r in results.items():
        x = r["ratio_paired"]
        speeds = [f"{r[precision]['sentences_per_s']:.1f}" for precision in PRECISIONS]
        rows.append([model, *speeds, f"{x['median']:.2f}", f"{x['min']:.2f}-{x['max']:.2f}"])
    header = ["model", "beam-5 sentences/s fp32", "bf16", "bf16 / fp32, paired: median", "range"]
    return "\n".join(bench.table(header, rows))


def main(argv=None):
    args = parse_args(argv)
    if args.decode_only:
        torch.set_num_threads(args.threads)
        results = {model: decode_speed(args, model) for model in args.models}
        print(decode_report(results), flush=True)
        what = (
            "beam-5 decoding alone, bf16 autocast against float32, alternating in one process: random weights "
            "and sources, every hypothesis forced to the same length (bf16_speed.py --decode-only)"
        )
        lengths = {"repeats": args.repeats, "gen_sentences": args.gen_sentences}
        fields = {**lengths, "gen_length": GEN_LENGTH, "vocabulary": DECODE_VOCAB, "results": results}
    else:
        data = bench.prepare_multi30k(args.data, args.out, "bf16-speed")
        results = {model: measure(args, data, model) for model in args.models}
        print(report(results), flush=True)
        what = (
            "bf16 mixed precision (--bf16) against float32: fairseq-train's tokens/s and peak RSS, "
            "fairseq-generate beam 5 sentences/s, Multi30k En-De, on a CPU"
        )
        lengths = {"updates": args.updates, "log_interval": args.log_interval, "repeats": args.repeats}
        fields = {**lengths, "gen_sentences": args.gen_sentences, "results": results}
    if args.json:
        units = bool(torch.cpu._is_avx512_bf16_supported())  # the CPU's bf16 units
        fields = {"cpu_bf16_units": units, "threads": args.threads, **fields}
        write_result(args.json, __file__, argv, args.machine, what=what, **fields)
        print(f"[bf16-speed] wrote {args.json}")


if __name__ == "__main__":
    with commands.exit_on_failure("bf16_speed.py"):
        main()
