"""Text steps of the WMT'14 recipes (called by prepare-wmt14en2*.sh): Moses tokenisation through
sacremoses with a process pool, SGML extraction and corpus cleaning. Each reproduces the Moses
script that fairseq's own recipe runs, named in its docstring.

Files are read and written as UTF-8, split on "\\n" only: a stray carriage return or U+2028 in a
corpus line must not split it, or the two sides of a parallel corpus would fall out of step.
Outputs are written to ``NAME.part`` and renamed when complete, so an interrupted run never
leaves a file that looks finished.
"""

import argparse
import gzip
import multiprocessing
import os
import re
import sys
from contextlib import ExitStack

import regex
from sacremoses import MosesPunctNormalizer, MosesTokenizer

CHUNK = 2000  # lines per task handed to a worker: large enough to hide the pool's overhead

_normalize = None  # per-worker state, built once by _init_worker
_tokenizer = None
_lc_norm_tok = False
_NON_PRINTING = regex.compile(r"\p{C}")


def open_text(path, mode="r"):
    """A corpus file, or its .gz (giga-fren ships gzipped): read without uncompressing on disk."""
    if "r" in mode and not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    if path.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8", errors="replace", newline="\n")
    return open(path, mode, encoding="utf-8", errors="replace", newline="\n")


def _init_worker(lang, training, lc_norm_tok=False):
    global _normalize, _tokenizer, _lc_norm_tok
    # perl_parity: the same rules as normalize-punctuation.perl, which fairseq's recipe runs
    _normalize = MosesPunctNormalizer(lang=lang, perl_parity=True).normalize if training or lc_norm_tok else None
    _tokenizer = MosesTokenizer(lang=lang)
    _lc_norm_tok = lc_norm_tok


def _tokenize_line(line):
    line = line.rstrip("\n")
    if _lc_norm_tok:
        # Multi30k's "lc.norm.tok" release: lowercase.perl | normalize-punctuation.perl -l L |
        # tokenizer.perl -l L, every split alike: no non-printing removal, no -a
        return _tokenizer.tokenize(_normalize(line.lower()), return_str=True, escape=True)
    if _normalize is not None:
        # normalize-punctuation.perl | remove-non-printing-char.perl
        line = _NON_PRINTING.sub(" ", _normalize(line))
    else:
        # fairseq's recipe only maps this apostrophe in the test sets before tokenising them
        line = line.replace("\u2019", "'")
    # tokenizer.perl -a: aggressive hyphen splitting (Bindestrich-Wörter -> Bindestrich @-@ Wörter)
    return _tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)


def _tokenize_chunk(lines):
    return [_tokenize_line(line) for line in lines]


def _chunks(lines):
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def tokenize_file(src, dst, lang, training, workers, lc_norm_tok=False):
    """Tokenise one file in order with *workers* processes, streaming (bounded memory)."""
    count = 0
    with open_text(src) as fin, open_text(dst + ".part", "w") as fout:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(lang, training, lc_norm_tok)) as pool:
            for chunk in pool.imap(_tokenize_chunk, _chunks(fin), chunksize=1):
                for line in chunk:
                    fout.write(line + "\n")
                count += len(chunk)
    return count


def cmd_tokenize(args):
    """Tokenise PREFIX.L1 and PREFIX.L2 into OUT.L1 and OUT.L2; both sides must keep one line per
    input line and end with the same number of lines, or nothing is written."""
    counts = {}
    for lang in args.langs:
        src, dst = f"{args.prefix}.{lang}", f"{args.out}.{lang}"
        counts[lang] = tokenize_file(src, dst, lang, not args.test, args.workers, args.lc_norm_tok)
        print(f"  {src}: {counts[lang]} lines", file=sys.stderr)
    if len(set(counts.values())) != 1:
        for lang in args.langs:
            os.remove(f"{args.out}.{lang}.part")
        sys.exit(f"error: {args.prefix}: the sides have different line counts {counts}")
    for lang in args.langs:
        os.replace(f"{args.out}.{lang}.part", f"{args.out}.{lang}")


_SEG_OPEN = re.compile(r"<seg[^>]+>\s*$", re.I)
_SEG_UNCLOSED = re.compile(r"<seg[^>]+>\s*(.*)\s*$", re.I)
_SEG = re.compile(r"<seg[^>]+>\s*(.*)\s*</seg>", re.I)


def sgm_segments(lines):
    """The segments of an SGML file in order, as input-from-sgm.perl extracts them: a segment
    may span lines; inner whitespace is collapsed to one space."""
    lines = iter(lines)
    for line in lines:
        line = line.rstrip("\n")
        while _SEG_OPEN.search(line) or (_SEG_UNCLOSED.search(line) and not _SEG.search(line)):
            nxt = next(lines, None)
            if nxt is None:
                break
            line += nxt.rstrip("\n")
        match = _SEG.search(line)
        if match:
            yield re.sub(r"\s+", " ", match.group(1)).strip(" ")


def cmd_sgm(args):
    count = 0
    with open_text(args.input) as fin, open_text(args.output + ".part", "w") as fout:
        for seg in sgm_segments(fin):
            fout.write(seg + "\n")
            count += 1
    os.replace(args.output + ".part", args.output)
    print(f"  {args.input}: {count} segments", file=sys.stderr)


def clean_pair(src_line, tgt_line, min_len, max_len, ratio, max_word_length=1000):
    """clean-corpus-n.perl's rules for one sentence pair: the cleaned pair, or None to drop it."""
    pair = []
    for line in (src_line, tgt_line):
        # "|" is Moses' factor separator; the tokenizer escapes it (&#124;), so none is factored
        line = re.sub(r"\s+", " ", line.replace("|", "")).strip(" ")
        if not line:
            return None
        pair.append(line)
    n_src, n_tgt = (len(line.split(" ")) for line in pair)
    if not (min_len <= n_src <= max_len and min_len <= n_tgt <= max_len):
        return None
    if n_src / n_tgt > ratio or n_tgt / n_src > ratio:
        return None
    if any(len(word) > max_word_length for line in pair for word in line.split(" ")):
        return None
    return pair


def cmd_clean(args):
    l1, l2 = args.langs
    kept = total = 0
    with ExitStack() as stack:
        f1, f2 = (stack.enter_context(open_text(f"{args.prefix}.{lang}")) for lang in (l1, l2))
        o1, o2 = (stack.enter_context(open_text(f"{args.out}.{lang}.part", "w")) for lang in (l1, l2))
        for line1 in f1:
            line2 = f2.readline()
            if not line2:
                sys.exit(f"error: {args.prefix}.{l2} is shorter than {args.prefix}.{l1}")
            total += 1
            pair = clean_pair(line1.rstrip("\n"), line2.rstrip("\n"), args.min, args.max, args.ratio)
            if pair is not None:
                o1.write(pair[0] + "\n")
                o2.write(pair[1] + "\n")
                kept += 1
        if f2.readline():
            sys.exit(f"error: {args.prefix}.{l2} is longer than {args.prefix}.{l1}")
    for lang in (l1, l2):
        os.replace(f"{args.out}.{lang}.part", f"{args.out}.{lang}")
    print(f"  {args.prefix}: kept {kept} of {total} sentence pairs", file=sys.stderr)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tokenize", help="normalise and tokenise a parallel corpus (Moses -a)")
    p.add_argument("prefix", help="reads PREFIX.L for each language L (or PREFIX.L.gz)")
    p.add_argument("out", help="writes OUT.L")
    p.add_argument("--langs", nargs=2, required=True, metavar=("L1", "L2"))
    p.add_argument(
        "--test", action="store_true", help="a dev/test set: no punctuation normalisation, as fairseq's recipe"
    )
    p.add_argument(
        "--lc-norm-tok",
        action="store_true",
        help="as Multi30k's lc.norm.tok release: lowercase, normalise punctuation, tokenise (no -a), any split",
    )
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("sgm", help="the segments of an SGML file, one a line")
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_sgm)

    p = sub.add_parser("clean", help="drop empty, too long and unbalanced pairs (clean-corpus-n)")
    p.add_argument("prefix")
    p.add_argument("out")
    p.add_argument("--langs", nargs=2, required=True, metavar=("L1", "L2"))
    p.add_argument("--min", type=int, default=1)
    p.add_argument("--max", type=int, default=250)
    p.add_argument("--ratio", type=float, default=1.5)
    p.set_defaults(func=cmd_clean)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
