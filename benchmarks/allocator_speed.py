"""glibc's allocator settings (common/allocator.py) against glibc's defaults, for a training on a CPU:
fairseq-train's words/s and peak memory at the quality study's 18+18 size, fairseq's `transformer`
and `pre-ln-realformer`, as the study trains them: one job of every core's threads, and one job a
core side by side (each its own words/s). Each pair of runs trains the same updates from the same
seed, so their logged losses must agree; the table says whether they do. Run it while nothing else
trains (a study's runner stopped just after an epoch's checkpoint: it resumes).

    python benchmarks/allocator_speed.py --json benchmarks/results/cpu-allocator-speed.json
    python benchmarks/allocator_speed.py --quick      # a minute: 4+4 layers, 12 updates

Words/s: fairseq's `wps` of every logged interval but the first (warm-up), their harmonic mean.
Peak memory: the fairseq-train process's peak resident set (ru_maxrss), its model and data included.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import os
import statistics

from benchmarks import bench
from benchmarks.bench import say
from common import allocator, commands
from common.presets import PRESETS
from common.repo import VARIANTS

WHO = "allocator-speed"
CPU_MODEL = tuple(PRESETS["cpu"].model)  # the quality study's widths: d=128, FFN 256, 4 heads
MODELS = {  # fairseq's own Transformer, and the Pre-LN study's variant on the plugin's model
    "transformer": ("--arch", "transformer"),
    "pre-ln-realformer": ("--arch", "realformer_iwslt_de_en", *VARIANTS["pre-ln-realformer"]),
}
TRAIN = (
    *bench.MULTI30K_TRAINING,
    *"--cpu --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 400 --max-tokens 4096 --no-save".split(),
)
SETTINGS = {"glibc defaults": {}, "allocator.py": allocator.SETTINGS}


def parse_args(argv=None):
    p = bench.training_parser(__doc__, MODELS, WHO, updates=30)
    p.add_argument("--layers", type=int, default=18, help="encoder and decoder layers (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="4+4 layers, 12 updates: proves it runs")
    return bench.training_args(p, argv, MODELS, {"layers": 4, "updates": 12, "log_interval": 4})


def environment(settings, threads):
    """This process's environment without any allocator setting, then *settings*, on *threads*."""
    env = {k: v for k, v in os.environ.items() if k not in allocator.SETTINGS and k != allocator.OPT_OUT}
    return {**env, **settings, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def measure(args, data, model, jobs, setting):
    """*jobs* fairseq-train runs of *model* side by side, every core's threads shared among them,
    with *setting*'s environment: each one's words/s, peak RSS and logged losses."""
    threads = max(1, os.cpu_count() // jobs)
    work = args.out / f"{model}-{jobs}x{threads}-{'tuned' if SETTINGS[setting] else 'default'}"
    work.mkdir(parents=True, exist_ok=True)
    layers = ["--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers)]
    cmd = [bench.fairseq_program("fairseq-train"), str(data), *TRAIN, *MODELS[model], *CPU_MODEL, *layers]
    cmd += ["--max-update", str(args.updates), "--log-interval", str(args.log_interval)]
    env = environment(SETTINGS[setting], threads)
    runs = []
    for run in commands.wait_all([commands.Process(cmd, work / f"train-{job}.log", env=env) for job in range(jobs)]):
        losses = [fields["loss"] for fields in bench.log_records(run.output)]
        words_per_s = round(bench.timed_words_per_s(run.output), 1)
        runs.append({"words_per_s": words_per_s, "peak_rss_mb": round(run.peak_rss / 2**20), "losses": losses})
    say(WHO, f"{model}, {jobs} job(s) x {threads} thread(s), {setting}: " + ", ".join(describe(r) for r in runs))
    return {"jobs": jobs, "threads": threads, "setting": setting, "runs": runs}


def describe(run):
    return f"{run['words_per_s']:.0f} words/s, peak {run['peak_rss_mb']} MB"


def speedup(pair):
    """The allocator settings' words/s over glibc's defaults, every job's summed."""
    tuned, default = ([r["words_per_s"] for r in pair[s]["runs"]] for s in ("allocator.py", "glibc defaults"))
    return sum(tuned) / sum(default)


def report(rows):
    """The table: per model and layout, glibc's defaults beside the settings."""
    table = []
    for (model, jobs), pair in rows.items():
        default, tuned = pair["glibc defaults"], pair["allocator.py"]
        speed = [" + ".join(f"{r['words_per_s']:.0f}" for r in cell["runs"]) for cell in (default, tuned)]
        peaks = [max(r["peak_rss_mb"] for r in cell["runs"]) for cell in (default, tuned)]
        same = all(a["losses"] == b["losses"] for a, b in zip(default["runs"], tuned["runs"]))
        table.append([model, f"{jobs} × {default['threads']}", *speed, f"{speedup(pair):.2f}", *peaks])
        table[-1].append("yes" if same else "NO")
    header = ["model", "jobs × threads", "words/s, glibc defaults", "words/s, allocator.py", "×"]
    return "\n".join(bench.table([*header, "peak RSS MB, defaults", "allocator.py", "same losses"], table))


def main(argv=None):
    args = parse_args(argv)
    data = bench.prepare_multi30k(args.data, args.out, WHO)
    rows = {}
    for model in args.models:
        for jobs in (1, 2):
            order = bench.in_turn(SETTINGS, len(rows))
            rows[model, jobs] = {setting: measure(args, data, model, jobs, setting) for setting in order}
    print(report(rows), flush=True)
    what = (
        f"glibc's allocator settings (common/allocator.py) against glibc's defaults: fairseq-train words/s and "
        f"peak RSS, {args.layers}+{args.layers} layers at the quality study's widths, Multi30k En-De, float32, CPU"
    )
    results = [{"model": model, **cell} for (model, _), pair in rows.items() for cell in pair.values()]
    ratio = round(statistics.median(speedup(pair) for pair in rows.values()), 2)
    content = {"what": what, "settings_compared": SETTINGS, "results": results, "ratio_median": ratio}
    bench.write_json(args, __file__, argv, "cpu", args.machine, ("out", "data"), **content)
    if args.json:
        say(WHO, f"wrote {args.json}")


if __name__ == "__main__":
    with commands.exit_on_failure("allocator_speed.py"):
        main()
