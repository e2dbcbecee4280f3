#!/usr/bin/env python3
"""Translate a test set with fairseq-generate and report two BLEU scores, each labelled:

- sacreBLEU: detokenized hypotheses against the raw reference file, with its signature (the
  number to compare across papers);
- tokenized compound-split BLEU, as fairseq computes its WMT'14 En-De numbers
  (scripts/compound_split_bleu.sh): fairseq-generate's tokenized hypotheses (H lines) and
  references (T lines), BPE removed, hyphenated compounds split as "a ##AT##-##AT## b", then
  BLEU with no further tokenization (sacrebleu tokenize=none, as multi-bleu.perl). With
  --tokenized-bleu plain, compounds are not split: multi-bleu's number on the tokenized text, as
  the Multi30k literature reports it (--tokenized-reference then names its tokenized reference).

--lowercase scores sacreBLEU case-insensitively (its signature says case:lc): for a model trained
on lowercased text, whose output has no case to compare.

    python scripts/score.py --data data-bin/wmt14_en_de --checkpoint checkpoints/avg.pt \\
        --source-lang en --target-lang de --reference newstest2014.de --bpe subword_nmt --detok moses

Flags score.py does not know are passed on to fairseq-generate (e.g. --fp16, --max-len-b 50).
score.py removes BPE itself, so do not pass --remove-bpe. It writes to --output-dir the raw
fairseq-generate output, the hypotheses in corpus order (detokenized: SUBSET.hyp.LANG; tokenized:
SUBSET.hyp.tok.LANG), the tokenized references and scores.txt/scores.json. (The BLEU4 line at the
end of fairseq-generate's output is computed on BPE pieces: not a score to report.)

Before translating it checks what would otherwise fail afterwards: the reference exists and has as
many lines as the split has sentences, --output-dir can be written and overwrites no input, the
checkpoint loads. Everything is written to a temporary folder and moved into --output-dir at the
end: a run that fails or is interrupted leaves nothing there.

Scoring only: --hypotheses FILE (detokenized, one per reference line) skips generation; its
tokenized BLEU then Moses-tokenizes hypotheses and reference (--detok moses) or takes them as
they are (--detok none). --generate-output FILE scores a fairseq-generate output already written.
"""

import argparse
import contextlib
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from user_error import UserError  # scripts/user_error.py

PROG = "score.py"
RESULT_LINE = re.compile(r"^([A-Z])-(\d+)\t(.*)$")  # S-/T-/H-/D-/P-<id>\t... of fairseq-generate


def read_lines(path, flag):
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: no such file")
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def remove_bpe(line, bpe):
    """As fairseq's post_process: subword-nmt's '@@ ' joins; sentencepiece's '▁' marks spaces."""
    if bpe == "subword_nmt":
        return (line + " ").replace("@@ ", "").rstrip()
    if bpe == "sentencepiece":
        return line.replace(" ", "").replace("\u2581", " ").strip()
    return line


def split_compounds(line):
    # fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def parse_generate_output(lines, bpe):
    """Tokenized hypotheses and references, by sentence id, from fairseq-generate's H/T lines.

    fairseq-generate prints sentences in batch order (sorted by length), not corpus order."""
    hypotheses, references = {}, {}
    for line in lines:
        match = RESULT_LINE.match(line)
        if match and match.group(1) == "H":
            _score, _, text = match.group(3).partition("\t")
            hypotheses.setdefault(int(match.group(2)), remove_bpe(text, bpe))  # first = best of --nbest
        elif match and match.group(1) == "T":
            references[int(match.group(2))] = remove_bpe(match.group(3), bpe)
    return hypotheses, references


def in_order(by_id, what, source):
    if sorted(by_id) != list(range(len(by_id))):
        missing = sorted(set(range(max(by_id, default=-1) + 1)) - set(by_id))[:5]
        raise UserError(f"{source}: {what} ids are not 0..{len(by_id) - 1} (missing e.g. {missing})")
    return [by_id[i] for i in range(len(by_id))]


def split_size(data, subset, src, tgt):
    """Sentences in the binarised split *subset* of *data*, found where fairseq's translation
    task looks for it (the first folder of a DATA1:DATA2 list; either direction of the pair)."""
    from fairseq.data import data_utils

    folder = data.split(os.pathsep)[0]
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        dataset = data_utils.load_indexed_dataset(os.path.join(folder, f"{subset}.{pair}.{src}"), None)
        if dataset is not None:
            return len(dataset)
    raise UserError(f"--data {data}: no {subset} split of {src}-{tgt} there ({subset}.{src}-{tgt}.{src}.idx)")


def check_checkpoints(paths):
    """Every checkpoint of --checkpoint (A.pt:B.pt for an ensemble) loads: tensors are mapped,
    not read, so a large checkpoint costs little here."""
    from fairseq_realformer.errors import RealformerConfigError
    from fairseq_realformer.files.checkpoints import read_checkpoint

    for path in paths.split(os.pathsep):
        try:
            read_checkpoint(path, mmap=True)
        except RealformerConfigError as e:  # missing, damaged, not fairseq's, an unknown global
            raise UserError(f"--checkpoint {e}") from None


def nearest_existing(folder):
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def check_output_dir(folder, names, inputs):
    """--output-dir can be created or written, and none of the files *names* it will hold is an
    input. Nothing is created yet."""
    existing = nearest_existing(folder)
    if not os.path.isdir(existing):
        raise UserError(f"--output-dir {folder}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--output-dir {folder}: {existing} is not writable")
    for name in names:
        if os.path.realpath(os.path.join(folder, name)) in inputs:
            raise UserError(
                f"--output-dir would overwrite the input {os.path.join(folder, name)}; choose another folder"
            )


@contextlib.contextmanager
def staged(folder):
    """A temporary folder whose files move into *folder* only when the block succeeds: a failed
    or interrupted run leaves no partial output, nor a new empty folder. A new *folder* appears
    in one step (a rename); into an existing one the scores move last, so that scores.txt marks
    a finished run."""
    stage = tempfile.mkdtemp(prefix=".score-", dir=nearest_existing(folder))
    try:
        yield stage
        if os.path.isdir(folder):
            for name in sorted(os.listdir(stage), key=lambda name: name.startswith("scores.")):
                os.replace(os.path.join(stage, name), os.path.join(folder, name))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(stage, 0o777 & ~umask)  # mkdtemp makes it private; give it a new folder's permissions
            os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
            os.replace(stage, folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def output_names(args):
    """The files score.py writes to --output-dir."""
    names = ["scores.txt", "scores.json"]
    if not args.hypotheses:
        subset, lang = args.gen_subset, args.target_lang
        names += [f"{subset}.hyp.{lang}", f"{subset}.hyp.tok.{lang}", f"{subset}.ref.tok.{lang}"]
        if not args.generate_output:
            names.append(f"generate-{subset}.txt")
    return names


def run_generate(args, extra, log_path):
    """Run fairseq-generate: its results (stdout) to log_path, its log and progress to stderr."""
    tool = shutil.which("fairseq-generate", path=os.path.dirname(sys.executable)) or shutil.which("fairseq-generate")
    if tool is None:
        raise UserError("fairseq-generate not found next to this Python or on PATH; run scripts/setup_env.sh")
    cmd = [
        tool,
        args.data,
        "--user-dir",
        args.user_dir,
        "--path",
        args.checkpoint,
        "--gen-subset",
        args.gen_subset,
        "--source-lang",
        args.source_lang,
        "--target-lang",
        args.target_lang,
        "--beam",
        str(args.beam),
        "--lenpen",
        str(args.lenpen),
        "--batch-size",
        str(args.batch_size),
        *extra,
    ]
    print(f"{PROG}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    with open(log_path, "w", encoding="utf-8") as log:
        if subprocess.run(cmd, stdout=log).returncode != 0:
            raise UserError("fairseq-generate failed (its error is above); nothing was written")
    return read_lines(log_path, "fairseq-generate output")


def moses(lang):
    from sacremoses import MosesDetokenizer, MosesTokenizer

    return MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)


def bleu_scores(hyp_detok, ref_raw, hyp_tok, ref_tok, lowercase=False, split=True):
    from sacrebleu.metrics import BLEU

    sacre = BLEU(lowercase=lowercase)
    tokenized = BLEU(tokenize="none", force=True)  # force: the input is tokenized on purpose
    if split:
        hyp_tok, ref_tok = [split_compounds(h) for h in hyp_tok], [split_compounds(r) for r in ref_tok]
    return (
        sacre.corpus_score(hyp_detok, [ref_raw]),
        sacre.get_signature(),
        tokenized.corpus_score(hyp_tok, [ref_tok]),
        tokenized.get_signature(),
    )


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def parse_args(argv):
    # allow_abbrev=False: flags meant for fairseq-generate must not be taken as abbreviations of ours
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--data", help="fairseq-preprocess output folder (data-bin)")
    parser.add_argument("--checkpoint", help="model checkpoint to translate with")
    parser.add_argument("--source-lang", required=True)
    parser.add_argument("--target-lang", required=True, help="also the language of Moses (de)tokenization")
    parser.add_argument("--reference", required=True, help="raw (untokenized) reference file of --gen-subset, .gz ok")
    parser.add_argument("--gen-subset", default="test", help="split to translate (default %(default)s)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default %(default)s)")
    parser.add_argument("--lenpen", type=float, default=0.6, help="length penalty (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per batch (default %(default)s)")
    parser.add_argument(
        "--bpe",
        choices=["subword_nmt", "sentencepiece", "none"],
        default="subword_nmt",
        help="how to remove BPE from fairseq-generate's output (default %(default)s)",
    )
    parser.add_argument(
        "--detok",
        choices=["moses", "none"],
        default="moses",
        help="detokenizer for the BPE-free hypotheses (default %(default)s)",
    )
    parser.add_argument(
        "--tokenized-bleu",
        choices=["compound-split", "plain"],
        default="compound-split",
        help="the tokenized BLEU: compounds split as fairseq's WMT'14 En-De numbers, or plain (multi-bleu's; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--tokenized-reference",
        metavar="FILE",
        help="the tokenized reference of the tokenized BLEU, one line per sentence (default: fairseq-generate's "
        "T lines, which show <<unk>> for a word out of the dictionary)",
    )
    parser.add_argument("--lowercase", action="store_true", help="sacreBLEU case-insensitive (case:lc)")
    parser.add_argument(
        "--output-dir",
        help="where to write hypotheses and scores "
        "(default: CHECKPOINT_DIR/score-SUBSET-CHECKPOINT_NAME; none with --hypotheses)",
    )
    parser.add_argument("--user-dir", help="fairseq --user-dir (default: this repository's fairseq_realformer)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--hypotheses", metavar="FILE", help="score these detokenized hypotheses; no generation")
    mode.add_argument("--generate-output", metavar="FILE", help="score this fairseq-generate output; no generation")
    args, extra = parser.parse_known_args(argv)
    if not (args.hypotheses or args.generate_output):
        if not (args.data and args.checkpoint):
            parser.error("--data and --checkpoint are required (or score existing output with --hypotheses FILE)")
        if "--remove-bpe" in extra:
            parser.error("do not pass --remove-bpe: score.py removes BPE itself (--bpe)")
        if args.output_dir is None:
            name = os.path.splitext(os.path.basename(args.checkpoint))[0]
            args.output_dir = os.path.join(os.path.dirname(args.checkpoint), f"score-{args.gen_subset}-{name}")
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)} (nothing is generated here)")
    if args.user_dir is None:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        args.user_dir = os.path.join(repo, "fairseq_realformer")
    return args, extra


def hypotheses_and_references(args, extra, ref_raw, stage):
    """(where the hypotheses come from, detokenized hypotheses, tokenized hypotheses, tokenized
    references, what the tokenized references are), all in corpus order. fairseq-generate's
    output goes to the folder *stage*."""
    tokenizer, detokenizer = moses(args.target_lang) if args.detok == "moses" else (None, None)
    if args.hypotheses:
        hyp_detok = read_lines(args.hypotheses, "--hypotheses")
        tokenize = (lambda s: tokenizer.tokenize(s, escape=False, return_str=True)) if tokenizer else (lambda s: s)
        what = "Moses-tokenized reference" if tokenizer else "reference as is"
        return args.hypotheses, hyp_detok, list(map(tokenize, hyp_detok)), list(map(tokenize, ref_raw)), what
    if args.generate_output:
        source, lines = args.generate_output, read_lines(args.generate_output, "--generate-output")
    else:
        source = os.path.join(args.output_dir, f"generate-{args.gen_subset}.txt")  # where it will be
        lines = run_generate(args, extra, os.path.join(stage, os.path.basename(source)))
    hyps, refs = parse_generate_output(lines, args.bpe)
    hyp_tok = in_order(hyps, "hypothesis (H-)", source)
    ref_tok = in_order(refs, "reference (T-)", source) if refs else []
    if len(ref_tok) != len(hyp_tok):
        raise UserError(f"{source} has {len(hyp_tok)} hypotheses but {len(ref_tok)} T- references")
    hyp_detok = [detokenizer.detokenize(h.split()) for h in hyp_tok] if detokenizer else hyp_tok
    return source, hyp_detok, hyp_tok, ref_tok, "fairseq-generate's T lines"


def main(argv=None):
    args, extra = parse_args(argv)
    generating = not (args.hypotheses or args.generate_output)
    try:
        # what would otherwise fail after minutes of translation, first
        ref_raw = read_lines(args.reference, "--reference")
        ref_tok_given = None
        if args.tokenized_reference:
            ref_tok_given = read_lines(args.tokenized_reference, "--tokenized-reference")
            if len(ref_tok_given) != len(ref_raw):
                raise UserError(
                    f"--tokenized-reference {args.tokenized_reference} has {len(ref_tok_given)} lines, "
                    f"--reference {args.reference} {len(ref_raw)}"
                )
        inputs = {os.path.realpath(p) for p in (args.reference, args.hypotheses, args.generate_output) if p}
        if args.output_dir:
            check_output_dir(args.output_dir, output_names(args), inputs)
        if generating:
            sentences = split_size(args.data, args.gen_subset, args.source_lang, args.target_lang)
            if sentences != len(ref_raw):
                raise UserError(
                    f"--reference {args.reference} has {len(ref_raw)} lines, but the {args.gen_subset} "
                    f"split of --data {args.data} has {sentences} sentences"
                )
            check_checkpoints(args.checkpoint)
        with staged(args.output_dir) if args.output_dir else contextlib.nullcontext() as stage:
            source, hyp_detok, hyp_tok, ref_tok, tok_ref_what = hypotheses_and_references(args, extra, ref_raw, stage)
            if ref_tok_given is not None:
                ref_tok, tok_ref_what = ref_tok_given, f"the tokenized reference {args.tokenized_reference}"
            if len(hyp_detok) != len(ref_raw):
                raise UserError(
                    f"{source} has {len(hyp_detok)} hypotheses, --reference {args.reference} has {len(ref_raw)} lines"
                )
            compound_split = args.tokenized_bleu == "compound-split"
            sacre, sacre_sig, tok, tok_sig = bleu_scores(
                hyp_detok, ref_raw, hyp_tok, ref_tok, lowercase=args.lowercase, split=compound_split
            )
            case = ", case-insensitive" if args.lowercase else ""
            tok_name = "compound_split" if compound_split else "tokenized"  # the JSON's name of the tokenized BLEU
            report = [
                f"sacreBLEU: {sacre.score:.2f} ({sacre_sig}) detokenized hypotheses vs raw reference {args.reference}{case}",
                f"  {sacre}",
                f"compound-split BLEU: {tok.score:.2f} ({tok_sig}) tokenized hypotheses vs {tok_ref_what}, "
                f"compounds split a ##AT##-##AT## b as fairseq's compound_split_bleu.sh; not comparable with sacreBLEU"
                if compound_split
                else f"tokenized BLEU: {tok.score:.2f} ({tok_sig}) tokenized hypotheses vs {tok_ref_what}, "
                f"multi-bleu's number; not comparable with sacreBLEU",
                f"  {tok}",
            ]
            if stage:
                if not args.hypotheses:
                    write_lines(os.path.join(stage, f"{args.gen_subset}.hyp.{args.target_lang}"), hyp_detok)
                    write_lines(os.path.join(stage, f"{args.gen_subset}.hyp.tok.{args.target_lang}"), hyp_tok)
                    write_lines(os.path.join(stage, f"{args.gen_subset}.ref.tok.{args.target_lang}"), ref_tok)
                write_lines(os.path.join(stage, "scores.txt"), report)
                scores = {
                    "sacrebleu": sacre.score,
                    "sacrebleu_signature": str(sacre_sig),
                    f"{tok_name}_bleu": tok.score,
                    f"{tok_name}_signature": str(tok_sig),
                    "sentences": len(hyp_detok),
                    "reference": args.reference,
                    **({"lowercase": True} if args.lowercase else {}),
                    **({"tokenized_reference": args.tokenized_reference} if args.tokenized_reference else {}),
                }
                write_lines(os.path.join(stage, "scores.json"), [json.dumps(scores, indent=1)])
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(report))


if __name__ == "__main__":
    main()
