"""bf16 against float32 for beam decoding alone, in one process, without data or training (what
``bf16_speed.py --decode-only`` runs, with its flags): each model of MODELS (bf16_speed.py's models,
defined here) with random weights (bench.build; ω profiled on one random batch, as speed.py's), a
dictionary of Multi30k's size (DECODE_VOCAB), --gen-sentences random sources of 8-20 tokens
(Multi30k's test sentences average 12 words) translated as one batch (64: fairseq-generate's
--batch-size) with beam 5 by fairseq's SequenceGenerator, every hypothesis forced to 24 tokens,
--repeats times in float32 and under the bf16 autocast (``precision.autocast``, as fairseq-generate
--bf16 runs), alternating and swapping the order each repeat, so that a busy machine slows both
alike. It reports each precision's median sentences/s and the median (and range) of the per-repeat
ratios bf16 / float32.

    python benchmarks/bf16_decode_speed.py --threads 1 --repeats 21 --gen-sentences 64 \\
        --models small-transformer,small-realformer

bf16_speed.py imports this module (its models, the forced length, the measurement), never the other
way: this command hands its arguments to bf16_speed.py's, with ``--decode-only``.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # this checkout: its packages, first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    safe = ["-P"] if sys.version_info >= (3, 11) else []  # -P: no package of the folder it runs in (another checkout)
    os.execve(sys.executable, [sys.executable, *safe, "-m", "benchmarks.bf16_decode_speed", *sys.argv[1:]], env)

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks import bench
from benchmarks.bench import say
from common.presets import PRESETS
from common.repo import VARIANTS

SMALL = tuple(PRESETS["cpu"].model_flags())  # the quality study's model (--preset cpu): 4+4 layers, d=128
MODELS = {  # bf16_speed.py's --models
    "wmt-transformer": ("--arch", "transformer_wmt_en_de", "--max-tokens", "2048"),
    "wmt-realformer": ("--arch", "realformer_wmt_en_de", "--max-tokens", "2048"),
    "small-transformer": ("--arch", "transformer", *SMALL, "--max-tokens", "4096"),
    "small-realformer": ("--arch", "realformer_iwslt_de_en", *SMALL, *VARIANTS["realformer"], "--max-tokens", "4096"),
}
GEN_LENGTH = 24  # every hypothesis: about a Multi30k sentence's length in pieces
DECODE_VOCAB = 7792  # the joint sentencepiece dictionary of Multi30k (examples/multi30k/run.sh), specials included


def decode_sample(dictionary, sentences, seed=1):
    """Random left-padded sources of 8-20 tokens (EOS last), as fairseq's collater shapes them
    (bench.batch's are of one length)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 21, (sentences,), generator=g)
    src = torch.full((sentences, int(lengths.max())), dictionary.pad())
    for i, n in enumerate(lengths.tolist()):
        src[i, src.size(1) - n :] = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=g)
        src[i, -1] = dictionary.eos()
    return {"net_input": {"src_tokens": src, "src_lengths": lengths}}


def build(model):
    """*model* (a MODELS entry: its flags after bench.build's) with random weights, ω profiled on one
    random batch as speed.py's."""
    import torch

    from fairseq_realformer.modules import admin

    flags = (*MODELS[model], "--dropout", "0.3")  # its --arch, and its layers where not the WMT arch's 6
    built, dictionary = bench.build("fairseq", 6, "cpu", torch.float32, flags, DECODE_VOCAB)
    admin.initialize(built, bench.batch(dictionary, 64, 16, "cpu", seed=5)["net_input"])  # nothing without ADMIN
    return built.eval(), dictionary


def decode_speed(args, model):
    """Beam-5 sentences/s of *model* in float32 and under the bf16 autocast, alternating in this process."""
    import torch
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_realformer.optim import precision

    built, dictionary = build(model)
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

    runs = {"fp32": [], "bf16": []}
    for precision_name in runs:  # warm-up: allocator, lazy initialisation, the autocast's first casts
        sentences_per_s(precision_name)
    for repeat in range(args.repeats):
        for precision_name in ("fp32", "bf16") if repeat % 2 == 0 else ("bf16", "fp32"):
            runs[precision_name].append(sentences_per_s(precision_name))
    ratios = [b / f for f, b in zip(runs["fp32"], runs["bf16"])]
    say("bf16-speed", f"{model}: bf16/fp32 {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
    speeds = {
        name: {**median_range(xs, 2, "sentences_per_s"), "runs": [round(x, 2) for x in xs]} for name, xs in runs.items()
    }
    return {**speeds, "ratio_paired": median_range(ratios, 3)}


def median_range(xs, digits, median="median"):
    return {median: round(statistics.median(xs), digits), "min": round(min(xs), digits), "max": round(max(xs), digits)}


def report(results):
    rows = [
        "| model | beam-5 sentences/s fp32 | bf16 | bf16 / fp32, paired: median | range |",
        "|---|---|---|---|---|",
    ]
    for model, r in results.items():
        x = r["ratio_paired"]
        rows.append(
            f"| {model} | {r['fp32']['sentences_per_s']:.1f} | {r['bf16']['sentences_per_s']:.1f} | "
            f"{x['median']:.2f} | {x['min']:.2f}-{x['max']:.2f} |"
        )
    return "\n".join(rows)


def measure_all(args):
    """Every --models' decoding and the table: the results, which bf16_speed.py writes to --json."""
    import torch

    torch.set_num_threads(args.threads)
    results = {model: decode_speed(args, model) for model in args.models}
    print(report(results), flush=True)
    return results


if __name__ == "__main__":  # bf16_speed.py --decode-only: its flags, and the command its JSON names
    bf16_speed = str(Path(__file__).with_name("bf16_speed.py"))
    os.execv(sys.executable, [sys.executable, bf16_speed, *sys.argv[1:], "--decode-only"])
