"""What realformer-analyze costs next to a plain forward pass over the same sentences: the
checkpoint, split and first --max-sentences sentences batched as realformer-analyze does (its
flags), then timed, interleaved and repeated (loading, batching and figures are not):

    forward    the model's plain teacher-forced forward pass (logits, as validation computes them)
    features   the same without the output projection (``features_only``), as the analysis runs it
    analysis   what realformer-analyze does per batch: the features pass with every layer's
               per-head probabilities recorded, entropy, adjacent-layer JSD, histograms, sample

The median of each, and the medians of the per-repeat ratios analysis / forward and analysis /
features (the cost of recording and of the statistics themselves).

    python benchmarks/analysis_speed.py DATA_BIN --checkpoints CKPT --max-sentences 1000 --cpu
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import argparse
import os
import statistics
import sys

import torch

from benchmarks.bench import sync, timed
from common.host import cpu_model
from common.repo import quiet_logging
from common.results import write_result
from fairseq_realformer.analysis import cli
from fairseq_realformer.analysis.measure import measure


def main(argv=None) -> None:
    own = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other flags: those of realformer-analyze (one checkpoint).",
    )
    own.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default: %(default)s)")
    own.add_argument("--json-out", metavar="FILE", help="also write the timings as JSON")
    bench, rest = own.parse_known_args(argv)
    args = cli.build_parser().parse_args(rest)
    quiet_logging()
    cli.check_args(args)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    path = args.checkpoints[0]
    model, task = cli.load_model(path, args, device == "cuda")
    count, samples = cli.batches(cli.load_split(path, task, args.gen_subset), model, args, device == "cuda")
    samples = list(samples)
    tokens = sum(int(s["ntokens"]) for s in samples)

    def forward(features_only=False):
        with torch.no_grad():
            for sample in samples:
                model(**sample["net_input"], features_only=features_only)
        sync(device)

    def analysis():
        measure(model, samples, unit=args.entropy_unit, sample_size=args.sample_size, seed=args.seed)
        sync(device)

    runs = {"forward": forward, "features": lambda: forward(features_only=True), "analysis": analysis}
    forward()  # warm-up: first-call allocations
    times = {name: [] for name in runs}
    for _ in range(bench.repeats):
        for name, run in runs.items():
            times[name].append(timed(run))
    ratios = {
        f"analysis/{name}": [a / b for a, b in zip(times["analysis"], times[name])] for name in ("forward", "features")
    }
    cpu = f"CPU ({cpu_model()}), {torch.get_num_threads()} torch threads, {os.cpu_count()} cores"
    result = {
        "checkpoint": path,
        "split": args.gen_subset,
        "sentences": count,
        "target_tokens": tokens,
        "batches": len(samples),
        "device": torch.cuda.get_device_name() if device == "cuda" else cpu,
        "median_s": {name: statistics.median(t) for name, t in times.items()},
        "median_ratio": {name: statistics.median(r) for name, r in ratios.items()},
        "repeats_s": times,
    }
    print(
        f"{count} sentences ({tokens} target tokens, {len(samples)} batches) of {args.gen_subset!r}, {result['device']}"
    )
    for name, t in times.items():
        print(f"{name:<9} {statistics.median(t):6.2f} s  (repeats: {', '.join(f'{x:.2f}' for x in t)})")
    for name, r in ratios.items():
        print(
            f"{name}: {statistics.median(r):.2f}x (median of the per-repeat ratios {', '.join(f'{x:.2f}' for x in r)})"
        )
    if bench.json_out:
        write_result(bench.json_out, __file__, argv, **result)


if __name__ == "__main__":
    sys.exit(main())
