"""Does a translation model use its source? A model can lower its validation loss as a language model
of the target alone and then translate every source into one sentence (DeepNorm at 18+18 layers,
STUDY.md); its loss curve does not say so. Two measures on a subset:

- target NLL with its own source and with an impostor's: the loss per target token (bits, no label
  smoothing: fairseq's nll_loss) with each sentence's source, and with the source of the sentence
  next to it in its batch (fairseq sorts batches by length, so the impostor is about as long). A
  model that reads its source scores the impostor far worse; one that ignores it scores both alike.
- the encoder's token spread by layer: over every real source token of the subset (padding and EOS
  left out), E‖x − x̄‖² / E‖x‖² of the vectors after the embedding, after each encoder layer, and at
  the encoder's output (what cross-attention reads). 0 means every token leaves as one vector; the
  ratio does not depend on the vectors' scale, so backbones compare.

    python studies/source_use.py runs/depth-18/deepnorm-lr0.002-layers18/seed1
    python studies/source_use.py CHECKPOINT.pt [CHECKPOINT.pt ...] --data DATA_BIN
    python studies/source_use.py RUN ... --fresh --json FILE   # also the untrained model; the rows as JSON
    python studies/source_use.py RUN ... --figure OUT.png      # both measures drawn, a line per model

A run folder of studies/quality.py stands for checkpoints/checkpoint_avg.pt, the model its
translations came from, and its data is its bin/ unless --data says. --fresh adds each checkpoint's
architecture freshly initialised from the checkpoint's seed, as fairseq-train builds it: it tells a
collapse the model learned from one it was built with.
"""

if __name__ == "__main__" and not __package__:  # run by its path, from any folder: as `python -m` its module
    import by_path  # noqa: F401  (common/by_path.py, linked beside this file)

import math
import os
import re
from pathlib import Path

from common.commands import InputError, exit_on_failure
from common.repo import STOCK, VARIANTS, repo_relative
from common.results import write_result
from studies.checkpoints import batches, checkpoints_of, import_plugin, load, parser
from studies.figures import frame, save, variant_colours
from studies.runs import RunFolder

PROG = "source_use.py"
MARKERS = ".osv^D"  # the models of one variant (its seeds, its epochs), in one colour


def parse_args(argv=None):
    p = parser(PROG, __doc__)
    p.add_argument("--fresh", action="store_true", help="also measure each architecture freshly initialised")
    p.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    p.add_argument("--figure", metavar="PNG", help="also draw the spread by layer and the NLLs into PNG")
    return p.parse_args(argv)


def with_impostor_sources(sample):
    """*sample* with each sentence's source replaced by the next sentence's (the last takes the first's)."""
    net_input = sample["net_input"]
    rolled = {key: net_input[key].roll(-1, dims=0) for key in ("src_tokens", "src_lengths")}
    return {**sample, "net_input": {**net_input, **rolled}}


class Spread:
    """E‖x − x̄‖² / E‖x‖² over the vectors added, in float64 sums (a subset's tokens, in batches)."""

    def __init__(self):
        self.count, self.total, self.squares = 0, 0.0, 0.0

    def add(self, vectors):  # N x C
        vectors = vectors.double()
        self.count += len(vectors)
        self.total = self.total + vectors.sum(0)
        self.squares += float(vectors.pow(2).sum())

    def value(self) -> float:
        mean_square = self.squares / self.count
        return (mean_square - float((self.total / self.count).pow(2).sum())) / mean_square


def measure(model, task, criterion, subset: str, max_tokens: int) -> dict:
    """The NLL (bits per target token) with own and impostor sources, and the token spread by layer."""
    import torch

    model.eval()
    nll = {"own": 0.0, "impostor": 0.0}
    tokens, sentences, spreads = 0, 0, None
    with torch.no_grad():
        for sample in batches(model, task, subset, max_tokens):
            if len(sample["id"]) < 2:  # no other sentence to lend its source
                continue
            for key, batch in (("own", sample), ("impostor", with_impostor_sources(sample))):
                _, _, logged = criterion(model, batch)
                nll[key] += float(logged.get("nll_loss", logged["loss"]))  # plain cross-entropy has no nll_loss
            tokens, sentences = tokens + int(logged["ntokens"]), sentences + len(sample["id"])
            source = sample["net_input"]["src_tokens"]
            states = model.encoder(source, sample["net_input"]["src_lengths"], return_all_hiddens=True)
            real = (source.ne(task.source_dictionary.pad()) & source.ne(task.source_dictionary.eos())).t()  # T x B
            layers = [*states["encoder_states"], states["encoder_out"][0]]  # embedding, 1..N, output
            spreads = spreads or [Spread() for _ in layers]
            for spread, x in zip(spreads, layers):
                spread.add(x[real])
    if not sentences:
        raise InputError(f"--subset {subset}: no batch of two or more sentences to swap sources in")
    return {
        "sentences": sentences,
        "target_tokens": tokens,
        "nll_own": nll["own"] / tokens / math.log(2),
        "nll_impostor": nll["impostor"] / tokens / math.log(2),
        "spread": [s.value() for s in spreads],
    }


def fresh_model(task, cfg):
    """The checkpoint's architecture built anew from its seed, as fairseq-train builds it."""
    import numpy as np
    from fairseq import utils

    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    return task.build_model(cfg.model)


def rounded(value, digits=4):
    """*value* rounded (a list's items each; None stays None), as the JSON keeps it."""
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return None if value is None else round(value, digits)


def spread_labels(depth: int, short=False) -> list:
    """The names of a token spread's *depth* positions: the embedding, each encoder layer, the output."""
    inner = range(1, depth - 1)
    return ["emb", *map(str, inner), "out"] if short else ["embedding", *(f"layer {i}" for i in inner), "output"]


def short_name(model: str) -> str:
    """RUN/seedN for a run folder's average (with the checkpoint's stem for any other checkpoint of
    it), else the model's name as given."""
    name = RunFolder.checkpoint_name(model.split(" freshly")[0])
    return model if name is None else name + (", untrained" if " freshly" in model else "")


def variant_of(name: str) -> str:
    """The variant of a study's run that a model's short name names (VARIANT-SUFFIX/seedS), for its
    colour; else the name itself."""
    folder, _, seed = name.partition(" ")[0].partition("/")
    known = [v for v in [*VARIANTS, *STOCK] if folder == v or folder.startswith(f"{v}-")]
    return max(known, key=len) if known and re.fullmatch(r"seed\d+", seed) else name


def draw(rows, subset, path):
    """Left: each model's token spread after the embedding, every encoder layer and the output
    (untrained models dashed, in their checkpoint's colour and marker; a variant's colour, its models
    told apart by their marker). Right: NLL with own and impostor source."""
    names = [short_name(r["model"]) for r in rows]
    colours = variant_colours(list(dict.fromkeys(variant_of(n.removesuffix(", untrained")) for n in names)))
    markers = {}
    for model in dict.fromkeys(n.removesuffix(", untrained") for n in names):
        markers[model] = MARKERS[sum(variant_of(n) == variant_of(model) for n in markers) % len(MARKERS)]
    fig, (spread, nll) = frame((13, 5), 2, gridspec_kw={"width_ratios": [3, 2]})
    for row, name in zip(rows, names):
        model = name.removesuffix(", untrained")
        style, colour = "--" if name.endswith(", untrained") else "-", colours[variant_of(model)]
        spread.plot(range(len(row["spread"])), row["spread"], style, color=colour, marker=markers[model], label=name)
    depth = max(len(r["spread"]) for r in rows)
    spread.set_xticks(range(depth), spread_labels(depth, short=True))
    spread.set_xlabel("encoder position (embedding, layer 1 … N, output)")
    spread.set_ylabel("token spread E‖x − x̄‖² / E‖x‖²")
    spread.set_ylim(-0.02, 1.02)
    spread.set_title("Source tokens' spread after each encoder layer (0: one vector for every token)", fontsize=10)
    spread.grid(alpha=0.3)
    spread.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    width = 0.4
    for offset, key, label in (
        (-width / 2, "nll_own", "own source"),
        (width / 2, "nll_impostor", "neighbour's source"),
    ):
        nll.bar([i + offset for i in range(len(rows))], [r[key] for r in rows], width, label=label)
    nll.set_xticks(range(len(rows)), names, rotation=35, ha="right", fontsize=7)
    nll.set_ylabel("NLL per target token (bits)")
    nll.set_title("Target NLL with its own source and with a neighbour's", fontsize=10)
    nll.grid(alpha=0.3, axis="y")
    nll.legend(fontsize=8)
    data = ", ".join(dict.fromkeys(r["data"] for r in rows))
    sentences = ", ".join(dict.fromkeys(str(r["sentences"]) for r in rows))
    fig.suptitle(f"Does the model use its source? The {subset} subset of {data} ({sentences} sentences)", fontsize=11)
    save(fig, path)


def print_tables(rows, subset):
    print(f"{subset}: NLL per target token (bits, no label smoothing) with its own source and a neighbour's\n")
    print("| model | updates | own source | impostor source | impostor − own |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['model']} | {row['updates']} | {row['nll_own']:.3f} | {row['nll_impostor']:.3f} "
            f"| {row['nll_impostor'] - row['nll_own']:+.3f} |"
        )
    by_name = [dict(zip(spread_labels(len(r["spread"])), r["spread"])) for r in rows]
    names = spread_labels(max(len(r["spread"]) for r in rows))  # a shallower encoder leaves cells empty
    print(f"\n{subset}: token spread E‖x − x̄‖² / E‖x‖² of the encoder (0: every source token is one vector)\n")
    print("| encoder | " + " | ".join(f"({i + 1})" for i in range(len(rows))) + " |")
    print("|---|" + "---|" * len(rows))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{s[name]:.3f}" if name in s else "" for s in by_name) + " |")
    print("\n" + "\n".join(f"({i + 1}) {row['model']}" for i, row in enumerate(rows)))


def main(argv=None):
    args = parse_args(argv)
    import_plugin()
    rows = []
    with exit_on_failure(PROG):
        for path in args.paths:
            ((checkpoint, data),) = checkpoints_of(Path(path), args.data, average_only=True)
            model, task, criterion, updates, cfg = load(checkpoint, data, args.subset)
            models = [(str(checkpoint), updates, model)]
            if args.fresh:
                models.append((f"{checkpoint} freshly initialised (seed {cfg.common.seed})", 0, fresh_model(task, cfg)))
            for name, steps, net in models:
                measured = measure(net, task, criterion, args.subset, args.max_tokens)
                rows.append({"model": name, "updates": steps, "data": repo_relative(data), **measured})
    print_tables(rows, args.subset)
    if args.figure:
        draw(rows, args.subset, args.figure)
    if args.json:
        units = {"nll": "bits per target token", "spread": "E|x - mean|^2 / E|x|^2 over source tokens"}
        kept = [{**row, **{k: rounded(row[k]) for k in ("nll_own", "nll_impostor", "spread")}} for row in rows]
        spread_at = "embedding, encoder layers 1..N, encoder output"
        write_result(args.json, __file__, argv, subset=args.subset, units=units, spread_at=spread_at, rows=kept)
    return rows


if __name__ == "__main__":
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin loads checkpoints safely
    main()
