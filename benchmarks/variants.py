"""The model variants the benchmarks compare, as flags on top of a realformer architecture."""

_NO_RESIDUAL_ATTENTION = ["--residual-attention-paths", "none"]
_ADMIN_PROFILED = ["--backbone", "admin", "--admin-init", "profile"]  # the ADMIN paper's init

VARIANTS = {
    "post-ln": [*_NO_RESIDUAL_ATTENTION, "--backbone", "post-ln"],  # = fairseq's transformer
    "pre-ln": [*_NO_RESIDUAL_ATTENTION, "--backbone", "pre-ln"],
    "admin": [*_NO_RESIDUAL_ATTENTION, *_ADMIN_PROFILED],
    "deepnorm": [*_NO_RESIDUAL_ATTENTION, "--backbone", "deepnorm"],
    "realformer-sum": ["--residual-attention-paths", "all", *_ADMIN_PROFILED, "--residual-attention-mode", "sum"],
    "realformer-mean": ["--residual-attention-paths", "all", *_ADMIN_PROFILED, "--residual-attention-mode", "mean"],
}


def check(parser, names):
    """The comma list *names* as a list, or a parser error naming the unknown ones."""
    chosen = names.split(",")
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return chosen
