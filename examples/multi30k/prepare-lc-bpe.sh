#!/usr/bin/env bash
# Multi30k as the literature's text-only baselines prepare it (Wu et al. 2021, and the work that
# reuses their data): the dataset's "lc.norm.tok" text (lowercase, Moses punctuation normaliser,
# Moses tokenizer without -a) made from the raw files, joint BPE (subword-nmt), one joined
# dictionary. The steps after tokenising are the WMT'14 pipeline's own (../wmt14/prepare-common.sh);
# each is skipped when its output exists.
#
#   examples/multi30k/prepare-lc-bpe.sh [options] DATA_DIR PREP_DIR DEST_DIR
#     --source-lang L --target-lang L   (default: en -> de)
#     --test-sets A,B,...               test sets of DATA_DIR (default: test_2016_flickr)
#     --bpe-tokens N                    joint BPE merges (default: 10000)
#     --workers N                       processes (default: nproc)
#
# DATA_DIR holds train/val/TEST.L.gz (raw). PREP_DIR: the tokenised text, the BPE codes (code) and
# the BPE'd splits. DEST_DIR: fairseq-preprocess's output (valid, then test, test1, ... in the
# order of --test-sets), and DEST_DIR/tok/SUBSET.L, the tokenised, lowercased text of each
# evaluation split before BPE: the reference the literature's BLEU is computed against.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../wmt14/prepare-common.sh
source "$here/../wmt14/prepare-common.sh"
usage() { sed -n '2,18p' "$0" | cut -c3-; exit 2; }

SRC=en TGT=de BPE_TOKENS=10000 WORKERS=$(nproc 2>/dev/null || echo 4) test_sets=test_2016_flickr
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
        --source-lang) SRC=$2; shift 2 ;;
        --target-lang) TGT=$2; shift 2 ;;
        --test-sets) test_sets=$2; shift 2 ;;
        --bpe-tokens) BPE_TOKENS=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) die "unknown option $1" ;;
        *) positional+=("$1"); shift ;;
    esac
done
[ ${#positional[@]} = 3 ] || usage
data=${positional[0]} PREP=${positional[1]} DEST=${positional[2]}
TMP=$PREP/tmp TRAIN=$PREP/tmp/train USER_DIR=$(cd "$here/../.." && pwd)/fairseq_realformer
IFS=, read -r -a tests <<<"$test_sets"
# the evaluation splits under fairseq's names: val is valid, the test sets test, test1, ...
splits=(val "${tests[@]}") EVAL_SETS=(valid)
for i in "${!tests[@]}"; do EVAL_SETS+=("test$([ "$i" -gt 0 ] && echo "$i" || true)"); done
mkdir -p "$TMP"

for i in "${!splits[@]}"; do
    out=$TMP/${EVAL_SETS[$i]}
    if have "$out.$SRC" "$out.$TGT"; then skip "${splits[$i]} already tokenised: $out.{$SRC,$TGT}"; continue; fi
    say "lowercase, normalise punctuation, tokenise: $data/${splits[$i]}.{$SRC,$TGT}.gz"
    "${TEXT[@]}" tokenize "$data/${splits[$i]}" "$out" --langs "$SRC" "$TGT" --lc-norm-tok --workers "$WORKERS"
done
if have "$TRAIN.$SRC" "$TRAIN.$TGT"; then skip "train already tokenised: $TRAIN.{$SRC,$TGT}"; else
    say "lowercase, normalise punctuation, tokenise: $data/train.{$SRC,$TGT}.gz"
    "${TEXT[@]}" tokenize "$data/train" "$TRAIN" --langs "$SRC" "$TGT" --lc-norm-tok --workers "$WORKERS"
fi

learn_and_apply_bpe
for set in train "${EVAL_SETS[@]}"; do clean_or_copy "$set" copy; done  # every pair kept, in order
binarize
mkdir -p "$DEST/tok"
for set in "${EVAL_SETS[@]}"; do
    have "$DEST/tok/$set.$TGT" || cp "$TMP/$set.$TGT" "$DEST/tok/$set.$TGT"
done
say "done: $DEST ($(($(wc -l <"$DEST/dict.$TGT.txt"))) types in the joined dictionary), tokenised references in $DEST/tok"
