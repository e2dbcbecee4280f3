"""``realformer-analyze``: the RealFormer paper's attention analyses for translation checkpoints.

    realformer-analyze DATA_BIN --checkpoints A.pt [B.pt ...] [--gen-subset valid]
        [--max-sentences N] [--out DIR] [--json FILE] [--source-lang L --target-lang L]
        [--cpu] [--max-tokens T]

Teacher-forced on the references of a split, for encoder self-attention, decoder self-attention
and cross-attention: per (layer, head), the entropy of each real query token's attention
distribution over the keys it may see, and the Jensen-Shannon divergence (bits) between head i
of layer L and head i of layer L-1 for the same token. Prints a summary table, draws the paper's
violin grids (and a comparison of the models) into --out, and writes --json for scripts.
"""

import argparse
import json
import logging
import math
import os
import re
import sys
import time
from typing import Dict, List, Sequence

import numpy as np
import torch
from fairseq import checkpoint_utils, tasks, utils
from fairseq.data import data_utils
from tqdm import tqdm

from ..errors import RealformerConfigError
from ..files import folders
from ..options import PATHS
from .capture import PATH_TITLES, attention_modules
from .measure import ModelAttention, measure
from .statistics import ENTROPY_UNITS, RESOLUTION

PROG = "realformer-analyze"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[2].replace("\n", " "),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "data", metavar="DATA_BIN", help="fairseq-preprocess output folder (dict.*.txt, SPLIT.*.bin/idx)"
    )
    parser.add_argument(
        "--checkpoints",
        nargs="+",
        required=True,
        metavar="CKPT",
        help="fairseq checkpoints: this plugin's realformer models or fairseq's transformer",
    )
    parser.add_argument(
        "--labels",
        nargs="+",
        metavar="NAME",
        help="a name per checkpoint for tables and figures (default: the shortest unique "
        "end of each checkpoint's path)",
    )
    parser.add_argument("--gen-subset", default="valid", metavar="SPLIT", help="the split whose references are fed")
    parser.add_argument(
        "--max-sentences",
        type=int,
        metavar="N",
        help="analyse the first N sentences of the split (default: all of them); batching is set by --max-tokens",
    )
    parser.add_argument("--max-tokens", type=int, default=4096, metavar="T", help="tokens per batch")
    parser.add_argument("--source-lang", metavar="L", help="default: the checkpoint's")
    parser.add_argument("--target-lang", metavar="L", help="default: the checkpoint's")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is visible")
    parser.add_argument(
        "--out", default="attention-analysis", metavar="DIR", help="folder for the figures (PNG and PDF)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the medians as JSON")
    parser.add_argument(
        "--entropy-unit",
        choices=sorted(ENTROPY_UNITS),
        default="nats",
        help="natural or base-2 logarithm (the paper does not state its unit; JSD is always in bits)",
    )
    parser.add_argument(
        "--entropy-thresholds",
        nargs=2,
        type=float,
        default=[1.5, 4.5],
        metavar=("LOW", "HIGH"),
        help="colour bands of the entropy violins by median, in --entropy-unit (the paper's)",
    )
    parser.add_argument(
        "--jsd-thresholds",
        nargs=2,
        type=float,
        default=[0.25, 0.75],
        metavar=("LOW", "HIGH"),
        help="colour bands of the JSD violins by median, in bits (the paper's)",
    )
    parser.add_argument(
        "--sample-size",
        type=int,
        default=5000,
        metavar="K",
        help="query tokens sampled uniformly per path for the violins (medians use every token)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the violins' token sample")
    parser.add_argument("--dpi", type=int, default=100, help="resolution of the PNG figures")
    return parser


def check_args(args) -> None:
    for flag, (low, high) in (
        ("--entropy-thresholds", args.entropy_thresholds),
        ("--jsd-thresholds", args.jsd_thresholds),
    ):
        if not low < high:
            raise RealformerConfigError(f"{flag} {low:g} {high:g}: LOW must be smaller than HIGH")
    for flag in ("max_sentences", "max_tokens", "sample_size", "dpi"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise RealformerConfigError(f"--{flag.replace('_', '-')} must be at least 1, not {value}")
    if args.labels is not None and len(args.labels) != len(args.checkpoints):
        raise RealformerConfigError(
            f"--labels gives {len(args.labels)} names, --checkpoints {len(args.checkpoints)} files: one name each"
        )
    if not os.path.isdir(args.data):
        raise RealformerConfigError(f"DATA_BIN {args.data}: no such folder")
    for path in args.checkpoints:
        if not os.path.isfile(path):
            raise RealformerConfigError(f"--checkpoints {path}: no such file")


def make_output_folders(args) -> List[str]:
    """--out and the folder of --json, made before the analysis runs rather than after it;
    returns the folders made (``folders.remove_empty`` takes them back if the command fails)."""
    made: List[str] = []
    for folder in (args.out, os.path.dirname(args.json or "")):
        try:
            made += folders.make(folder or ".")
        except OSError as e:
            folders.remove_empty(made)
            raise RealformerConfigError(f"cannot make the folder {folder} ({e.strerror})") from None
    return made


def unique_labels(paths: Sequence[str]) -> List[str]:
    """The shortest ends of the paths (without .pt) that tell them apart."""
    parts = [os.path.splitext(os.path.abspath(p))[0].split(os.sep) for p in paths]
    for n in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-n:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{i + 1}:{label}" for i, label in enumerate(labels)]  # the same file given twice


def load_model(path: str, args, use_cuda: bool):
    """The checkpoint's model (eval mode) and its translation task set up on DATA_BIN."""
    overrides = {"data": args.data}
    for name in ("source_lang", "target_lang"):
        if getattr(args, name):
            overrides[name] = getattr(args, name)
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path, overrides)
    except RealformerConfigError:  # the plugin's safe loading names what it refused
        raise
    except Exception as e:
        raise RealformerConfigError(f"{path} is not a readable fairseq checkpoint ({_first_line(e)})") from None
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None or cfg.get("task") is None:
        raise RealformerConfigError(f"checkpoint {path} has no model or task configuration")
    try:
        task = tasks.setup_task(cfg.task, from_checkpoint=True)
    except FileNotFoundError as e:
        raise RealformerConfigError(f"checkpoint {path} on {args.data}: {e}") from None
    except Exception as e:  # e.g. a language pair that cannot be inferred
        raise RealformerConfigError(
            f"checkpoint {path}: its task cannot be set up on {args.data} ({_first_line(e)})"
        ) from None
    check_dictionaries(path, state["model"], task)
    try:
        models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides=overrides, task=task, state=state
        )
    except Exception as e:  # an unregistered model, parameters that do not fit, ...
        raise RealformerConfigError(f"checkpoint {path} cannot be loaded ({_first_line(e)})") from None
    model = models[0].eval()
    try:
        attention_modules(model)
    except RealformerConfigError as e:
        raise RealformerConfigError(f"checkpoint {path}: {e}") from None
    return (model.cuda() if use_cuda else model), task


def check_dictionaries(path: str, params: Dict[str, torch.Tensor], task) -> None:
    """The model's embedding tables must have one row per symbol of DATA_BIN's dictionaries.
    (Dictionaries of the same size but different symbols cannot be told apart from here.)"""
    sides = (("encoder", "source", task.source_dictionary), ("decoder", "target", task.target_dictionary))
    for module, side, dictionary in sides:
        embedding = params.get(f"{module}.embed_tokens.weight")
        if embedding is not None and embedding.size(0) != len(dictionary):
            lang = getattr(task.cfg, f"{side}_lang")
            raise RealformerConfigError(
                f"checkpoint {path} does not match {task.cfg.data}: its {side} vocabulary has "
                f"{embedding.size(0)} symbols, dict.{lang}.txt has {len(dictionary)} (was it trained on this data?)"
            )


def load_split(path: str, task, split: str):
    data = task.cfg.data
    pair = f"{task.cfg.source_lang}-{task.cfg.target_lang}"
    try:
        task.load_dataset(split)
    except FileNotFoundError:
        raise RealformerConfigError(f"{data} has no split {split!r} for {pair} (--gen-subset)") from None
    except Exception as e:  # a task configuration the checkpoint lacks, an unreadable file, ...
        raise RealformerConfigError(
            f"checkpoint {path}: split {split!r} of {data} cannot be loaded ({_first_line(e)})"
        ) from None
    dataset = task.dataset(split)
    if getattr(dataset, "tgt", None) is None:
        raise RealformerConfigError(
            f"{data} split {split!r} has no {task.cfg.target_lang} side: teacher forcing needs the references"
        )
    return dataset


def batches(dataset, model, args, use_cuda: bool):
    """The first --max-sentences sentences (those the model can take), sorted by length and
    batched by --max-tokens: ``(number of sentences, iterator of samples)``."""
    count = len(dataset) if args.max_sentences is None else min(args.max_sentences, len(dataset))
    indices, too_long = dataset.filter_indices_by_size(np.arange(count, dtype=np.int64), model.max_positions())
    if len(too_long):
        print(
            f"{PROG}: warning: {len(too_long)} sentences longer than the model's positions are left out",
            file=sys.stderr,
        )
    if len(indices) == 0:
        raise RealformerConfigError(f"no sentence of split {args.gen_subset!r} can be analysed")
    indices = indices[np.argsort(dataset.num_tokens_vec(indices), kind="stable")]
    try:
        groups = data_utils.batch_by_size(
            indices, dataset.num_tokens, dataset.num_tokens_vec(indices).astype(np.int64), max_tokens=args.max_tokens
        )
    except (AssertionError, ValueError) as e:
        raise RealformerConfigError(f"--max-tokens {args.max_tokens}: {_first_line(e)}") from None

    def samples():
        for group in groups:
            sample = dataset.collater([dataset[int(i)] for i in group])
            yield utils.move_to_cuda(sample) if use_cuda else sample

    return len(indices), samples()


def analyse_checkpoint(path: str, label: str, args, use_cuda: bool) -> ModelAttention:
    model, task = load_model(path, args, use_cuda)
    dataset = load_split(path, task, args.gen_subset)
    count, samples = batches(dataset, model, args, use_cuda)
    started = time.perf_counter()
    # a progress bar on a terminal; none in logs (disable=None)
    with tqdm(total=count, unit="sent", desc=label, file=sys.stderr, disable=None, leave=False) as bar:
        paths = measure(
            model, samples, unit=args.entropy_unit, sample_size=args.sample_size, seed=args.seed, progress=bar.update
        )
    print(
        f"{PROG}: {label}: {count} sentences of {args.gen_subset!r} in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return ModelAttention(
        checkpoint=path, label=label, data=args.data, split=args.gen_subset, sentences=count, paths=paths
    )


def summary_table(results: Sequence[ModelAttention], unit: str) -> str:
    """Per model, path and layer: the median over all its tokens and heads, and the range of
    its heads' medians."""
    lines = [
        f"entropy in {unit}, JSD in bits between layer L-1 and L; median over tokens and heads "
        f"[lowest .. highest head median]; medians within ±{RESOLUTION / 2:g}"
    ]
    header = f"  {'path':<8} {'layer':>5}  {'entropy':<26} JSD"
    for result in results:
        lines += ["", f"{result.label}: {_on_what(result)}", header]
        for path in PATHS:
            stats = result.paths[path]
            entropy, entropy_heads = stats.entropy.median(pool_heads=True), stats.entropy.median()
            jsd, jsd_heads = stats.jsd.median(pool_heads=True), stats.jsd.median()
            for layer in range(stats.layers):
                cells = [_cell(entropy[layer], entropy_heads[layer])]
                cells.append(_cell(jsd[layer - 1], jsd_heads[layer - 1]) if layer else "-")
                lines.append(f"  {path:<8} {layer + 1:>5}  {cells[0]:<26} {cells[1]}")
    return "\n".join(lines)


def _on_what(result: ModelAttention) -> str:
    return f"{result.sentences} sentences of {result.split!r} in {os.path.normpath(result.data)}"


def _cell(pooled, heads) -> str:
    return f"{pooled:.3f} [{heads.min():.3f} .. {heads.max():.3f}]"


def to_json(results: Sequence[ModelAttention], unit: str) -> dict:
    """The issue's schema: per model and path, heads in the model's order, layers from the first."""

    def rounded(matrix):
        return [[round(float(v), 4) for v in row] for row in matrix]

    return {
        "entropy_unit": unit,
        "models": [
            {
                "checkpoint": r.checkpoint,
                "sentences": r.sentences,
                **{
                    path: {
                        "entropy_median": rounded(r.paths[path].entropy.median()),
                        "jsd_median": rounded(r.paths[path].jsd.median()),
                    }
                    for path in PATHS
                },
            }
            for r in results
        ],
    }


def draw(results: Sequence[ModelAttention], args) -> List[str]:
    """Every figure into --out; returns the files written."""
    from . import figures  # matplotlib is loaded only once there is something to draw

    unit, written = args.entropy_unit, []
    for result in results:
        stem = os.path.join(args.out, re.sub(r"[^\w.-]+", "_", result.label))
        data = f"{result.label} on {_on_what(result)}"
        for path in PATHS:
            stats = result.paths[path]
            about = f"{data}, {stats.tokens} query tokens"
            # the top of the axis: uniform attention over the most keys a token saw
            entropy_max = 1.05 * math.log(max(2, stats.most_keys)) / math.log(ENTROPY_UNITS[unit])
            fig = figures.violin_grid(
                stats.entropy_sample.numpy(),
                stats.entropy.median().numpy(),
                row_labels=[f"layer {n}" for n in range(1, stats.layers + 1)],
                thresholds=args.entropy_thresholds,
                quantity="entropy",
                unit=unit,
                title=f"Attention entropy per token: {PATH_TITLES[path]}\n{about}",
                y_max=entropy_max,
            )
            written += figures.save(fig, f"{stem}.{path}.entropy", args.dpi)
            if stats.layers < 2:
                continue
            fig = figures.violin_grid(
                stats.jsd_sample.numpy(),
                stats.jsd.median().numpy(),
                row_labels=[f"layers {n}-{n + 1}" for n in range(1, stats.layers)],
                thresholds=args.jsd_thresholds,
                quantity="JSD",
                unit="bits",
                title=f"JSD per token between head i of layers L-1 and L\n{PATH_TITLES[path]}\n{about}",
                y_max=1.05,
            )
            written += figures.save(fig, f"{stem}.{path}.jsd", args.dpi)
    if len(results) > 1:
        fig = figures.comparison(
            [r.label for r in results],
            [{p: r.paths[p].entropy.median(pool_heads=True).tolist() for p in PATHS} for r in results],
            [{p: r.paths[p].jsd.median(pool_heads=True).tolist() for p in PATHS} for r in results],
            unit=unit,
            title=f"Median attention entropy per layer and JSD between adjacent layers "
            f"(over tokens and heads), {_on_what(results[0])}",
        )
        written += figures.save(fig, os.path.join(args.out, "comparison"), args.dpi)
    return written


def quiet_fairseq_logging() -> None:
    # `import fairseq` leaves the root logger at DEBUG (a speech task calls basicConfig); what
    # fairseq logs while loading a checkpoint and a split is not this command's output
    logging.getLogger().setLevel(logging.WARNING)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    quiet_fairseq_logging()
    made: List[str] = []
    try:
        check_args(args)
        made = make_output_folders(args)
        use_cuda = torch.cuda.is_available() and not args.cpu
        labels = args.labels or unique_labels(args.checkpoints)
        results = [analyse_checkpoint(path, label, args, use_cuda) for path, label in zip(args.checkpoints, labels)]
        print(summary_table(results, args.entropy_unit))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(to_json(results, args.entropy_unit), f, indent=1)
        written = draw(results, args)
    except BaseException as e:
        folders.remove_empty(made)  # a failed run leaves no empty folder behind
        if not isinstance(e, RealformerConfigError):
            raise
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"\nfigures: {len(written)} files in {args.out}" + (f"; JSON: {args.json}" if args.json else ""))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
