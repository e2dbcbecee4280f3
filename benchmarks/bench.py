"""What benchmarks/speed.py times: a variant's model with random weights (VARIANTS, and any with
``+compiled``), random batches shaped as fairseq's collater shapes them, its training step and
beam-4 generation, in --dtype's precision. Also what the benchmarks that run fairseq-train share
(train_update.py, compiled_train.py, bf16_speed.py, allocator_speed.py): its flags, its log read,
the quality study's data, --json.
"""

import argparse
import contextlib
import os
import re
import shlex
import shutil
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

from common import commands, fairseq_log
from common.host import host
from common.presets import TRAINING
from common.repo import MULTI30K, REPO, RUNS, STOCK, USER_DIR, work_folder
from common.repo import VARIANTS as PLUGIN_VARIANTS  # (read as a file: fairseq is not imported yet)
from common.results import write_result

VARIANTS = {
    **{name: ["--arch", arch] for name, arch in STOCK.items()},
    **{name: ["--arch", "realformer", *flags] for name, flags in PLUGIN_VARIANTS.items()},
}
BASELINE = "fairseq"  # measured first in each cell; the ratios are to it
COMPILED = "+compiled"  # a variant's suffix: its layers compiled


def variant_flags(name):
    """The flags of *name*: a VARIANTS entry, or one + ``COMPILED`` (KeyError for anything else)."""
    base = name.removesuffix(COMPILED)
    compiled = base != name and base in PLUGIN_VARIANTS  # fairseq+compiled: compiled by hand in ``build``
    return [*VARIANTS[base], *(["--compile-layers"] if compiled else [])]


def known_variant(name):
    return name.removesuffix(COMPILED) in VARIANTS


SIZES = {"6L-6L": 6, "18L-18L": 18}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PRECISIONS = {
    "fp32": "float32",
    "bf16": "--bf16: bfloat16 autocast, float32 weights",
    "fp16": "--fp16: float16 model, float32 master weights",
}
FP16_LOSS_SCALE = 128.0  # fairseq's --fp16-init-scale
VOCAB = 10000
COMPILE_LINE = re.compile(r"--compile-layers: (.*)$", re.M)


def build(variant, layers, device, dtype, extra_flags=(), vocab=VOCAB):
    """The variant's model with random weights (the same seed for every variant); *extra_flags*
    after the variant's (e.g. another width), *vocab* symbols in its dictionary."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_realformer  # noqa: F401

    dictionary = Dictionary()
    for i in range(vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{i}")
    flags = ["/unused", "--user-dir", str(USER_DIR), *variant_flags(variant), "--share-all-embeddings"]
    flags += [*f"--encoder-layers {layers} --decoder-layers {layers} --dropout 0.1".split(), *extra_flags]
    args = options.parse_args_and_arch(options.get_training_parser(), flags)
    task = type("Task", (), {"source_dictionary": dictionary, "target_dictionary": dictionary})
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, task).to(device)
    if dtype != torch.float32:
        model = model.to(dtype)
    if variant == "fairseq" + COMPILED:  # by hand, as a fairseq user could: every layer, every call
        from fairseq_realformer.modules import compiled

        compiled.COMPILE_TIME.watch()
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            layer.compile(dynamic=True)
    return model, dictionary


def batch(dictionary, sentences, length, device, seed=0):
    """Random sentences of *length* tokens (source and target), as fairseq's collater shapes them."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(dictionary.nspecial, len(dictionary), (sentences, length), generator=g)
    tgt = torch.randint(dictionary.nspecial, len(dictionary), (sentences, length), generator=g)
    src[:, -1] = tgt[:, -1] = dictionary.eos()
    prev = torch.cat([tgt[:, -1:], tgt[:, :-1]], dim=1)
    return {
        "net_input": {
            "src_tokens": src.to(device),
            "src_lengths": torch.full((sentences,), length, device=device),
            "prev_output_tokens": prev.to(device),
        },
        "target": tgt.to(device),
    }


class Bench:
    """One variant at one size: its model, optimizer, a training batch and a generator."""

    def __init__(self, variant, layers, length, args):
        from fairseq.sequence_generator import SequenceGenerator

        from fairseq_realformer.modules import admin
        from fairseq_realformer.optim import precision

        self.device = args.device
        self.fp16 = args.dtype == "fp16"
        self.model, self.dictionary = build(variant, layers, args.device, DTYPES["fp16" if self.fp16 else "fp32"])
        self.sample = batch(self.dictionary, max(1, args.tokens_per_batch // length), length, args.device)
        admin.initialize(self.model, self.sample["net_input"])  # before the optimizer, as fairseq-train
        self.params = list(self.model.parameters())
        # fp16: Adam steps a float32 copy, which is copied back into the float16 model (FP16Optimizer)
        self.master = [p.detach().float().requires_grad_() for p in self.params] if self.fp16 else None
        self.optimizer = torch.optim.Adam(self.master or self.params, lr=1e-4, betas=(0.9, 0.98), eps=1e-8)
        bf16 = args.dtype == "bf16"
        self.autocast = partial(precision.autocast, torch.device(args.device).type) if bf16 else contextlib.nullcontext
        self.tokens = self.sample["target"].numel()
        self.gen_sample = batch(self.dictionary, max(1, args.gen_sentences), length, args.device, seed=1)
        self.generator = SequenceGenerator(
            [self.model], self.dictionary, beam_size=4, max_len_a=0, max_len_b=length, min_len=length
        )
        self.length = length

    def train_steps(self, steps):
        self.model.train()
        for _ in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            self.model.zero_grad(set_to_none=True)
            with self.autocast():
                logits, _ = self.model(**self.sample["net_input"])
                loss = torch.nn.functional.cross_entropy(
                    logits.float().view(-1, logits.size(-1)), self.sample["target"].view(-1)
                )
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite training loss {loss.item()}")
            if self.fp16:
                (loss * FP16_LOSS_SCALE).backward()
                for master, param in zip(self.master, self.params):
                    master.grad = param.grad.float().mul_(1 / FP16_LOSS_SCALE)
                self.optimizer.step()
                with torch.no_grad():
                    for master, param in zip(self.master, self.params):
                        param.copy_(master)
            else:
                loss.backward()
                self.optimizer.step()
        sync(self.device)

    @torch.no_grad()
    def generate(self):
        self.model.eval()
        with self.autocast():
            hypos = self.generator.forward(self.gen_sample)
        sync(self.device)
        assert all(len(h[0]["tokens"]) == self.length + 1 for h in hypos)  # fixed work: length + EOS


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ratio(x, y, digits=3):
    """*x* / *y* for a table, or — where either is missing (or zero)."""
    return f"{x / y:.{digits}f}" if x and y else "—"


def table(header, rows):
    """A Markdown table's lines: *header*'s cells, then each row's."""
    cells = [header, *rows]
    lines = [f"| {' | '.join(map(str, row))} |" for row in cells]
    return [lines[0], "|" + "---|" * len(header), *lines[1:]]


def say(who, text, file=None):
    """A progress line, ``[WHO HH:MM:SS] TEXT``, flushed."""
    print(f"[{who} {time.strftime('%H:%M:%S')}] {text}", file=file, flush=True)


def prepare_multi30k(data, work, who):
    """The quality study's data (joint sentencepiece 8k, Multi30k En-De, test_2016_flickr) from the
    raw folder *data*, binarised once by the recipe into WORK/data/bin; that folder."""
    folder = Path(work) / "data"
    if not (folder / "bin" / "dict.de.txt").exists():
        recipe = REPO / "examples" / "multi30k" / "run.sh"
        cmd = ["bash", str(recipe), "--prepare-only", "--test-sets", "test_2016_flickr", str(data), str(folder)]
        say(who, f"data: {shlex.join(cmd)}")
        commands.run(cmd, Path(work) / "prepare.log")
    return folder / "bin"


# every benchmark's fairseq-train trains with common.presets.TRAINING; on Multi30k on a CPU (bf16_speed.py, allocator_speed.py): the plugin, En-De, no validation
MULTI30K_TRAINING = ("--user-dir", str(USER_DIR), *TRAINING) + tuple(
    "--source-lang en --target-lang de --dropout 0.3 --seed 1 --no-progress-bar --disable-validation".split()
)


def fairseq_program(name):
    """fairseq's command *name* (fairseq-train, fairseq-generate): beside this Python, else on PATH."""
    return shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name) or name


def in_turn(names, repeat):
    """*names* in order at an even *repeat*, reversed at an odd one: a busy machine slows each alike."""
    return tuple(names)[:: 1 if repeat % 2 == 0 else -1]


def training_parser(doc, models, name, updates):
    """The flags of a benchmark that trains *models* (their keys) on Multi30k in the work folder
    runs/NAME (bf16_speed.py, allocator_speed.py); ``training_args`` reads them."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(models), help="comma list of %(default)s")
    p.add_argument("--updates", type=int, default=updates, help="training updates per run (default: %(default)s)")
    p.add_argument("--log-interval", type=int, default=10, help="updates per wps line (default: %(default)s)")
    p.add_argument("--data", default=str(MULTI30K), help="Multi30k folder")
    p.add_argument(
        "--out", default=RUNS / name, help=f"work folder (default: runs/{name}; runs/ is REALFORMER_RUNS when set)"
    )
    p.add_argument("--machine", default=host())
    p.add_argument("--json", help="also write the numbers here")
    return p


def prepare_data(data, work, who, tiny=False):
    """The binarised data of *data* (``multi30k``: ``prepare_multi30k``'s; ``toy``: the toy corpus,
    scripts/toy_corpus.py, 20,000 pairs or 2,000 *tiny*, in WORK/bin), with a joined dictionary,
    made once."""
    if data == "multi30k":
        return prepare_multi30k(MULTI30K, work, who)
    folder, log = Path(work) / "bin", Path(work) / "prepare.log"
    if not (folder / "dict.src.txt").exists():
        corpus = [sys.executable, REPO / "scripts" / "toy_corpus.py", "--out-dir", work]
        commands.run([*corpus, "--train", "2000" if tiny else "20000"], log)
        splits = [arg for name in ("train", "valid", "test") for arg in (f"--{name}pref", Path(work) / name)]
        binarize = [sys.executable, REPO / "scripts" / "binarize.py", "--source-lang", "src", "--target-lang", "tgt"]
        commands.run([*binarize, *splits, "--destdir", folder, "--workers", "2"], log, append=True)
    return folder


def training_args(p, argv, models, quick):
    """*argv* parsed by a fairseq-train benchmark's parser *p*, --quick setting *quick*'s values;
    --models (a comma list of *models*' keys), --updates and --log-interval checked, one line each;
    --out made the work folder."""
    args = p.parse_args(argv)
    if args.quick:
        vars(args).update(quick)
    args.models = args.models.split(",")
    unknown = set(args.models) - set(models)
    if unknown:
        p.error(f"--models: unknown {', '.join(sorted(unknown))}; choose from {', '.join(models)}")
    if args.updates < 2 * args.log_interval:
        p.error("--updates must be at least twice --log-interval (the first interval is warm-up)")
    args.out = work_folder(args.out)
    return args


def log_records(output, kind="train_inner"):
    """fairseq-train's log lines of *kind* in *output* (``train_inner``: its intervals), as dicts of numbers."""
    return [fields for _, fields in fairseq_log.records(output.splitlines(), kind)]


def timed_words_per_s(output):
    """fairseq-train's words/s over every logged interval of *output* but the first (warm-up): their
    words over their time (the harmonic mean of the intervals' wps)."""
    wps = [entry["wps"] for entry in log_records(output)[1:]]
    return len(wps) / sum(1 / w for w in wps)


def train_log(log, timed_from):
    """fairseq-train's JSON log read: its ``train_inner`` intervals that end at update *timed_from*
    or later, and a summary (their median words/s, the last loss and update, the compile lines)."""
    inner = log_records(log)
    timed = [r for r in inner if r["num_updates"] >= timed_from]
    return timed, {
        "wps": statistics.median(r["wps"] for r in timed) if timed else None,
        "intervals": len(timed),
        "loss_at_end": inner[-1]["loss"] if inner else None,
        "updates": int(inner[-1]["num_updates"]) if inner else 0,
        "compile_log": COMPILE_LINE.findall(log),
    }


def write_json(args, script, argv, device, machine, drop=(), **content):
    """--json, when given: common.results.write_result for *script* run with *argv* (None: this
    process's), the *device*, its settings *args* but --json and *drop* (unless *content* has settings)."""
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", *drop)}
        write_result(args.json, script, argv, machine, device=device, **{"settings": settings, **content})
