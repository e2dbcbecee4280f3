#!/usr/bin/env python3
"""Raw parallel text to fairseq's binary data in one step: optionally train a joint
sentencepiece BPE model on the training text and encode every split with it, then run
fairseq-preprocess with a joined dictionary. Used by the quickstart, the Multi30k recipe, the
benchmarks and the tests.

    python scripts/binarize.py --source-lang en --target-lang de \\
        --trainpref DATA/train --validpref DATA/val --testpref DATA/test_2016_flickr,DATA/test_2017_flickr \\
        --destdir runs/x/bin --spm-vocab 8000 --spm-dir runs/x/spm

A split's files are PREFIX.LANG or PREFIX.LANG.gz (read in place, never copied or changed). With
several --testpref prefixes fairseq names the test splits test, test1, test2, ... in that order.
Without --spm-vocab the text must be tokenized already and is binarised as it is.

--max-lines N (or train=N,valid=M,test=K) uses only the first lines of each split's files.
Resumable: the sentencepiece model (SPM_DIR/spm.model) and each encoded file are made only when
they do not exist (written to a temporary name, then renamed); the binary data go to
DESTDIR.tmp and are renamed to DESTDIR at the end, and an existing DESTDIR is left alone.
"""

import argparse
import gzip
import itertools
import os
import shutil
import subprocess
import sys

from user_error import UserError  # scripts/user_error.py

PROG = "binarize.py"
SPLITS = ("train", "valid", "test")


def lines(path, limit=None):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        yield from itertools.islice((line.rstrip("\n") for line in f), limit)


def text_file(prefix, lang, flag):
    """PREFIX.LANG, or PREFIX.LANG.gz."""
    for path in (f"{prefix}.{lang}", f"{prefix}.{lang}.gz"):
        if os.path.isfile(path):
            return path
    raise UserError(f"{flag} {prefix}: neither {prefix}.{lang} nor {prefix}.{lang}.gz exists")


def parse_max_lines(spec):
    """'N' (every split) or 'train=N,valid=M,test=K' -> {split: N}."""
    if spec is None:
        return {}
    if spec.isdigit():
        return dict.fromkeys(SPLITS, int(spec))
    limits = {}
    for item in spec.split(","):
        split, _, n = item.partition("=")
        if split not in SPLITS or not n.isdigit():
            raise UserError(f"--max-lines {spec}: give N, or a comma list of SPLIT=N with SPLIT in {', '.join(SPLITS)}")
        limits[split] = int(n)
    return limits


def train_spm(model_prefix, vocab_size, paths, limit):
    import sentencepiece as spm

    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    say(f"training {model_prefix}.model ({vocab_size} pieces) on {' '.join(paths)}")
    spm.SentencePieceTrainer.train(
        sentence_iterator=itertools.chain.from_iterable(lines(p, limit) for p in paths),
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        character_coverage=1.0,
        model_type="bpe",
        hard_vocab_limit=False,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,  # sentencepiece's own log is thousands of lines
    )


def encode(model_file, src, out, limit):
    """src encoded into out (pieces separated by spaces); an existing out is kept."""
    if os.path.exists(out):
        say(f"{out} exists, kept")
        return
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_file)
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        for line in lines(src, limit):
            f.write(" ".join(sp.encode(line, out_type=str)) + "\n")
    os.replace(out + ".tmp", out)
    say(f"encoded {src} -> {out}")


def preprocess(args, prefixes):
    """fairseq-preprocess into DESTDIR.tmp, then renamed to DESTDIR."""
    tool = shutil.which("fairseq-preprocess", path=os.path.dirname(sys.executable)) or shutil.which(
        "fairseq-preprocess"
    )
    if tool is None:
        raise UserError("fairseq-preprocess not found next to this Python or on PATH; run scripts/setup_env.sh")
    tmp = args.destdir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        tool,
        "--source-lang",
        args.source_lang,
        "--target-lang",
        args.target_lang,
        "--joined-dictionary",
        "--workers",
        str(args.workers),
        "--destdir",
        tmp,
    ]
    for split in SPLITS:
        if prefixes[split]:
            cmd += [f"--{split}pref", ",".join(prefixes[split])]
    say(" ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"fairseq-preprocess failed:\n{(result.stdout + result.stderr)[-3000:]}")
    os.replace(tmp, args.destdir)


def say(message):
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source-lang", required=True)
    parser.add_argument("--target-lang", required=True)
    parser.add_argument("--trainpref", required=True, metavar="PREFIX")
    parser.add_argument("--validpref", metavar="PREFIX")
    parser.add_argument("--testpref", metavar="PREFIX[,PREFIX...]")
    parser.add_argument("--destdir", required=True, help="where fairseq-preprocess writes the binary data")
    parser.add_argument(
        "--spm-vocab",
        type=int,
        metavar="N",
        help="train a joint sentencepiece BPE model of N pieces "
        "(fewer when the text cannot fill it) and encode every split with it",
    )
    parser.add_argument(
        "--spm-dir",
        help="with --spm-vocab: where the model (spm.model) and the encoded text go (default: DESTDIR/../spm)",
    )
    parser.add_argument("--max-lines", metavar="N|SPLIT=N,...", help="use only the first lines of each split")
    parser.add_argument("--workers", type=int, default=2, help="fairseq-preprocess workers (default %(default)s)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        if os.path.exists(os.path.join(args.destdir, f"dict.{args.target_lang}.txt")):
            say(f"{args.destdir} exists, kept")
            return
        limits = parse_max_lines(args.max_lines)
        given = {
            "train": [args.trainpref],
            "valid": [args.validpref] if args.validpref else [],
            "test": args.testpref.split(",") if args.testpref else [],
        }
        langs = (args.source_lang, args.target_lang)
        files = {
            split: [[text_file(p, lang, f"--{split}pref") for lang in langs] for p in prefixes]
            for split, prefixes in given.items()
        }
        if args.spm_vocab:
            spm_dir = args.spm_dir or os.path.join(os.path.dirname(os.path.abspath(args.destdir)), "spm")
            model = os.path.join(spm_dir, "spm")
            if not os.path.exists(model + ".model"):
                train_spm(model, args.spm_vocab, files["train"][0], limits.get("train"))
            prefixes = {split: [] for split in SPLITS}
            for split, pairs in files.items():
                for prefix, paths in zip(given[split], pairs):
                    encoded = os.path.join(spm_dir, os.path.basename(prefix))
                    for lang, path in zip(langs, paths):
                        encode(model + ".model", path, f"{encoded}.{lang}", limits.get(split))
                    prefixes[split].append(encoded)
        else:
            if limits or any(p.endswith(".gz") for pairs in files.values() for paths in pairs for p in paths):
                raise UserError(
                    "--max-lines and .gz input need --spm-vocab (fairseq-preprocess reads plain text as it is)"
                )
            prefixes = given
        preprocess(args, prefixes)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    say(f"wrote {args.destdir}")


if __name__ == "__main__":
    main()
