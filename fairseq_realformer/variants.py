"""The named model variants that the paper's table, the benchmarks and the WMT'14 recipe compare,
as plugin flags on top of any ``realformer`` architecture (which sets the size).

"realformer" is the RealFormer paper's NMT model: residual attention on all three paths, running
mean, on ADMIN with ω profiled on a training batch (the ADMIN paper's initialisation, which the
RealFormer paper built on). Every ADMIN variant here profiles ω, and every "-realformer" variant
adds residual attention on all three paths with the running mean, so the rows differ only in
what their names say. "realformer-value-residual" adds ResFormer's value residual (λ = ½) on all
three paths; "resi-dual" is the ResiDual backbone, "resi-dual-realformer" the same with residual
attention. "post-ln-realformer" is residual attention (running mean, all paths) on Post-LN, the
paper's BERT form; "pre-ln-realformer" the same on Pre-LN, the backbone a user picks for depth.
"pre-ln-hyper-connections", "pre-ln-mhc" and "pre-ln-denseformer" are Pre-LN with 4 residual streams
(Hyper-Connections, mHC) or DenseFormer's depth-weighted averages (docs/residual-paths.md).
"admin-radam" also sets the optimizer and drops the learning-rate warm-up (RAdam's claim): its
flags go after a recipe's own training flags, so that they win.

Shell scripts read a variant's flags, one per line, without importing fairseq:

    python fairseq_realformer/variants.py realformer
"""

import sys

_NO_RESIDUAL_ATTENTION = ("--residual-attention-paths", "none")
_RESIDUAL_ATTENTION_MEAN = ("--residual-attention-paths", "all", "--residual-attention-mode", "mean")
_ADMIN_PROFILED = ("--backbone", "admin", "--admin-init", "profile")

VARIANTS = {
    "post-ln": (*_NO_RESIDUAL_ATTENTION, "--backbone", "post-ln"),  # = fairseq's transformer
    "pre-ln": (*_NO_RESIDUAL_ATTENTION, "--backbone", "pre-ln"),
    "admin": (*_NO_RESIDUAL_ATTENTION, *_ADMIN_PROFILED),
    "deepnorm": (*_NO_RESIDUAL_ATTENTION, "--backbone", "deepnorm"),
    "realformer": (*_RESIDUAL_ATTENTION_MEAN, *_ADMIN_PROFILED),
    "realformer-sum": ("--residual-attention-paths", "all", "--residual-attention-mode", "sum", *_ADMIN_PROFILED),
    # the RealFormer paper's BERT form (and x-transformers' default): residual attention on Post-LN
    "post-ln-realformer": (*_RESIDUAL_ATTENTION_MEAN, "--backbone", "post-ln"),
    # residual attention on Pre-LN: the RealFormer paper's footnote 3 says it "potentially" works
    "pre-ln-realformer": (*_RESIDUAL_ATTENTION_MEAN, "--backbone", "pre-ln"),
    "rezero": (*_NO_RESIDUAL_ATTENTION, "--backbone", "rezero"),
    "rezero-realformer": (*_RESIDUAL_ATTENTION_MEAN, "--backbone", "rezero"),
    "t-fixup": (*_NO_RESIDUAL_ATTENTION, "--backbone", "t-fixup"),
    "t-fixup-realformer": (*_RESIDUAL_ATTENTION_MEAN, "--backbone", "t-fixup"),
    "admin-radam": (*_NO_RESIDUAL_ATTENTION, *_ADMIN_PROFILED, "--optimizer", "radam", "--warmup-updates", "0"),
    "realformer-value-residual": (
        *_RESIDUAL_ATTENTION_MEAN,
        "--value-residual-paths",
        "all",
        "--value-residual-mix",
        "half",
        *_ADMIN_PROFILED,
    ),
    "resi-dual": (*_NO_RESIDUAL_ATTENTION, "--backbone", "resi-dual"),
    "resi-dual-realformer": (*_RESIDUAL_ATTENTION_MEAN, "--backbone", "resi-dual"),
    # the residual-stream methods on Pre-LN, their papers' backbone: 4 streams (HC's and mHC's
    # translation-sized choice), dynamic weights; DenseFormer's averages after every layer (1x1)
    "pre-ln-hyper-connections": (*_NO_RESIDUAL_ATTENTION, "--backbone", "pre-ln", "--residual-streams", "4"),
    "pre-ln-mhc": (
        *_NO_RESIDUAL_ATTENTION,
        "--backbone",
        "pre-ln",
        "--residual-streams",
        "4",
        "--residual-streams-mix",
        "mhc",
    ),
    "pre-ln-denseformer": (*_NO_RESIDUAL_ATTENTION, "--backbone", "pre-ln", "--dense-residual", "dwa"),
}


def parse(names: str, flag: str = "--variants", also=()):
    """The comma list *names* as a list of variant names (of VARIANTS, or of *also*: a caller's own,
    such as a benchmark's fairseq); ValueError naming the unknown ones."""
    known = [*also, *VARIANTS]
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise ValueError(f"{flag}: unknown {', '.join(unknown) or 'nothing given'}; choose from {', '.join(known)}")
    return chosen


def main(argv) -> int:
    if len(argv) != 1:
        print(f"usage: variants.py NAME  (one of {', '.join(VARIANTS)})", file=sys.stderr)
        return 2
    try:
        (name,) = parse(argv[0], "--variant")
    except ValueError as e:
        print(f"variants.py: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(VARIANTS[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
