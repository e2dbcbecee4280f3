#!/usr/bin/env python3
"""Train a joint sentencepiece model on raw text and encode files with it (the Python API: the
pip wheel of sentencepiece has no spm_train/spm_encode binaries). Reads .gz files directly, so
raw data sets need no uncompressed copy.

    python scripts/spm_encode.py --model runs/x/spm --vocab-size 8000 \\
        --train train.en.gz train.de.gz \\
        --encode train.en.gz runs/x/spm/train.en --encode train.de.gz runs/x/spm/train.de

The model (MODEL.model, MODEL.vocab) is trained only when MODEL.model does not exist; each output
is written to a temporary file and renamed, and an output that exists is left alone.
"""
import argparse
import gzip
import itertools
import os
import sys

import sentencepiece as spm

PROG = "spm_encode.py"


def lines(path, limit=None):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        yield from itertools.islice((line.rstrip("\n") for line in f), limit)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="PREFIX", help="writes/reads PREFIX.model and PREFIX.vocab")
    parser.add_argument("--vocab-size", type=int, default=8000, help="joint vocabulary size (default %(default)s); "
                        "a smaller one is used when the training text cannot fill it")
    parser.add_argument("--train", nargs="+", metavar="FILE", default=[], help="raw text to train the model on")
    parser.add_argument("--encode", nargs=2, action="append", default=[], metavar=("IN", "OUT"),
                        help="encode IN into OUT (pieces separated by spaces); repeatable")
    parser.add_argument("--max-lines", type=int, help="use only the first N lines of every input file")
    args = parser.parse_args(argv)  # fmt: skip
    inputs = args.train + [src for src, _ in args.encode]
    for path in inputs:
        if not os.path.isfile(path):
            parser.error(f"{path}: no such file")
    for src, out in args.encode:
        if os.path.realpath(out) in map(os.path.realpath, inputs):
            parser.error(f"--encode {src} {out}: the output is an input")

    if not os.path.exists(args.model + ".model"):
        if not args.train:
            parser.error(f"{args.model}.model does not exist: give --train files to train it")
        os.makedirs(os.path.dirname(os.path.abspath(args.model)), exist_ok=True)
        print(f"{PROG}: training {args.model}.model ({args.vocab_size} pieces) on {' '.join(args.train)}", file=sys.stderr)
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain.from_iterable(lines(p, args.max_lines) for p in args.train),
            model_prefix=args.model, vocab_size=args.vocab_size, character_coverage=1.0,
            model_type="bpe", hard_vocab_limit=False, num_threads=os.cpu_count() or 1,
            minloglevel=2,  # sentencepiece's own log is thousands of lines
        )  # fmt: skip
    sp = spm.SentencePieceProcessor(model_file=args.model + ".model")
    for src, out in args.encode:
        if os.path.exists(out):
            print(f"{PROG}: {out} exists, kept", file=sys.stderr)
            continue
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            for line in lines(src, args.max_lines):
                f.write(" ".join(sp.encode(line, out_type=str)) + "\n")
        os.replace(out + ".tmp", out)
        print(f"{PROG}: encoded {src} -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
