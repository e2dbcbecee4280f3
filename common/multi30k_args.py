"""The arguments the Multi30k benchmarks share: the data folder, the variants, a JSON file."""

from pathlib import Path

from common.repo import MULTI30K, VARIANTS, parse_variants


def add(parser, default_variants: str, also=()) -> None:
    parser.add_argument(
        "--data",
        default=str(MULTI30K),
        help="Multi30k task-1 folder (train/val/test_* .LANG.gz) (default: %(default)s)",
    )
    parser.add_argument(
        "--variants",
        default=default_variants,
        help=f"comma list of {', '.join([*also, *VARIANTS])} (fairseq_realformer/variants.py; default: %(default)s)",
    )
    parser.add_argument("--json", help="also write the results here")


def check(parser, args, also=()) -> None:
    """Turn --variants into a list (of the plugin's variants, or of *also*); a one-line parser error
    for an unknown variant or data folder."""
    try:
        args.variants = parse_variants(args.variants, also=also)
    except ValueError as e:
        parser.error(str(e))
    if not (Path(args.data) / "train.en.gz").exists():
        parser.error(f"--data {args.data}: no train.en.gz there (expected the Multi30k layout, see its README)")
