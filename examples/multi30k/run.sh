#!/usr/bin/env bash
# Multi30k (task 1) translation with RealFormer, any two of en, de, fr, cs: joint sentencepiece
# BPE, fairseq-preprocess, fairseq-train, average the last checkpoints, beam search on the
# validation set and each test set, and sacreBLEU. Each step is skipped when its output exists;
# an interrupted training resumes.
#
#   examples/multi30k/run.sh [options] [DATA_DIR] [RUN_DIR] [-- fairseq-train flags...]
#     --source-lang L --target-lang L   two of en, de, fr, cs (default: en -> de)
#     --test-sets A,B,...               test sets to score, e.g. test_2016_flickr,test_2017_mscoco
#                                       (default: every test_* set of DATA_DIR in both languages)
#     --tiny                            first 300 lines, tiny model (the tests)
#     --bf16                            train and translate in bfloat16 mixed precision (CPU or GPU)
#     --prepare-only                    stop after the data are binarised (RUN_DIR/bin)
#     --published                       the literature's text-only recipe (Wu et al. 2021): lowercased,
#                                       Moses-tokenised text, joint BPE 10k, 4+4 layers d=128, lr 5e-3,
#                                       8,192 tokens an update, at most 8,000 updates, patience 10,
#                                       average of the last 10; BLEU on the tokenised, lowercased text
#
# DATA_DIR holds train.L.gz, val.L.gz and test_*.L.gz (raw text, read in place; default
# ../shared/data/multi30k from the repository root). RUN_DIR: runs/multi30k-SRC-TGT, under
# REALFORMER_RUNS when it is set (a folder that a fresh checkout keeps).
# Sized for one GPU (minutes); on a CPU it runs too, slowly, with glibc's allocator settings of
# common/allocator.py (REALFORMER_MALLOC=off: without). Set ARCH, EPOCHS to change them;
# flags after -- go to fairseq-train last, so they win (e.g. -- --backbone pre-ln).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
usage() { sed -n '2,24p' "$0" | cut -c3-; exit 2; }
die() { echo "run.sh: error: $*" >&2; exit 2; }

tiny=0 prepare_only=0 published=0 src=en tgt=de test_sets=
positional=() precision=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --tiny) tiny=1; shift ;;
    --prepare-only) prepare_only=1; shift ;;
    --published) published=1; shift ;;
    --bf16) precision=(--bf16); shift ;;
    --source-lang|--target-lang|--test-sets)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in --source-lang) src=$2 ;; --target-lang) tgt=$2 ;; --test-sets) test_sets=$2 ;; esac
      shift 2 ;;
    -h|--help) usage ;;
    -*) die "unknown option $1 (fairseq-train flags go after --)" ;;
    *) positional+=("$1"); shift ;;
  esac
done
[ "${1:-}" = "--" ] && shift
train_extra=("$@")
set -- ${positional[@]+"${positional[@]}"}
[ $# -le 2 ] || usage
data=${1:-$root/../shared/data/multi30k}
run=${2:-${REALFORMER_RUNS:-$root/runs}/multi30k-$src-$tgt$([ $tiny = 1 ] && echo -tiny || true)}
arch=${ARCH:-realformer_iwslt_de_en}

# --- the languages and test sets, checked before anything runs ---
check_lang() { case "$2" in en|de|fr|cs) ;; *) die "$1 $2: Multi30k's languages are en, de, fr and cs" ;; esac; }
check_lang --source-lang "$src"
check_lang --target-lang "$tgt"
[ "$src" != "$tgt" ] || die "--source-lang and --target-lang are both $src"
for split in train val; do
  for lang in $src $tgt; do
    [ -f "$data/$split.$lang.gz" ] || die "$data/$split.$lang.gz not found (DATA_DIR, --source-lang/--target-lang)"
  done
done
if [ -z "$test_sets" ]; then  # every test set in both languages, by name
  for path in "$data"/test_*."$src".gz; do
    name=$(basename "$path" ".$src.gz")
    [ -f "$path" ] && [ -f "$data/$name.$tgt.gz" ] && test_sets+=${test_sets:+,}$name
  done
  [ -n "$test_sets" ] || die "$data has no test set in both languages (test_*.$src.gz with test_*.$tgt.gz)"
fi
IFS=, read -r -a sets <<< "$test_sets"
for name in "${sets[@]}"; do
  for lang in $src $tgt; do
    [ -f "$data/$name.$lang.gz" ] || die "$data/$name.$lang.gz not found (--test-sets)"
  done
done

[ $tiny = 0 ] || [ $published = 0 ] || die "--tiny and --published exclude each other"
scoring=(--bpe sentencepiece --detok none)  # how score.py undoes the subwords and scores
schedule=()  # after the recipe's own schedule, so that it wins
if [ $published = 1 ]; then
  # Wu et al. 2021 (LividWo/Revisit-MMT, README-baseline.md), the published 4+4 text-only baseline,
  # on 2 GPUs of 4,096 tokens (here --update-freq 2); --clip-norm 25 is their fairseq's default
  # (0.12's is 0). No epoch limit: 8,000 updates or 10 epochs without a better validation loss.
  lines= epochs=${EPOCHS:-0} average=10
  model=(--encoder-layers 4 --decoder-layers 4 --encoder-embed-dim 128 --decoder-embed-dim 128
         --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4
         --decoder-attention-heads 4 --dropout 0.3 --attention-dropout 0 --activation-dropout 0)
  schedule=(--lr 5e-3 --warmup-updates 2000 --warmup-init-lr 1e-7 --update-freq 2 --clip-norm 25
            --max-update 8000 --patience 10)
  generate=()
  # the literature's BLEU: BPE removed, tokenised lowercased output against the tokenised lowercased
  # reference (multi-bleu's number); sacreBLEU and chrF case-insensitive on Moses-detokenised output
  scoring=(--bpe subword_nmt --detok moses --lowercase --tokenized-bleu plain)
elif [ $tiny = 1 ]; then
  lines=300 vocab=1000 epochs=${EPOCHS:-2} average=2
  model=(--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32
         --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64)
  generate=(--max-len-b 30)  # an untrained model would write 200 tokens a sentence
else
  # 512/1024/4 heads (the arch's size), 6+6 layers; dropout 0.3 for a 29k-sentence corpus
  lines= vocab=8000 epochs=${EPOCHS:-30} average=5
  model=(--dropout 0.3)
  generate=()
fi

say() { echo "[multi30k $(date +%H:%M:%S)] $*"; }
mkdir -p "$run"
# fairseq-preprocess names the test sets test, test1, ... in the order given: a run folder keeps
# the list it was binarised with, and refuses another.
if [ -e "$run/test-sets" ] && [ "$(cat "$run/test-sets")" != "$test_sets" ]; then
  die "$run was prepared for the test sets $(cat "$run/test-sets"), not $test_sets: choose another RUN_DIR"
fi
echo "$test_sets" > "$run/test-sets"
say "$src -> $tgt, data $data, output in $run, $arch, $([ "$epochs" = 0 ] && echo "no epoch limit" || echo "$epochs epochs")${lines:+, first $lines lines}$([ $published = 1 ] && echo ", the published recipe" || true)${precision[@]+, bfloat16 mixed precision}; test sets ${sets[*]}"

say "1/5 set-up: scripts/setup_env.sh"
"$root/scripts/setup_env.sh"
bin=${REALFORMER_VENV:-$root/.venv}/bin
py=$bin/python
# on a CPU, glibc's allocator settings that train ~1.35x faster with the same numbers, all three or
# none (common/allocator.py; REALFORMER_MALLOC=off keeps glibc's defaults)
while IFS= read -r setting; do export "${setting?}"; done < <("$py" "$root/common/allocator.py")

if [ -e "$run/bin/dict.$tgt.txt" ]; then say "2/5 subwords + binarize: $run/bin exists, skipped"
elif [ $published = 1 ]; then
  say "2/5 text + subwords + binarize: lowercase, Moses normalise + tokenise, joint BPE (10,000 merges), fairseq-preprocess"
  PATH="$bin:$PATH" PYTHON="$py" "$root/examples/multi30k/prepare-lc-bpe.sh" --source-lang $src --target-lang $tgt \
    --test-sets "$test_sets" "$data" "$run/lc-bpe" "$run/bin"
else
  say "2/5 subwords + binarize: joint sentencepiece BPE ($vocab) on the raw training text, then fairseq-preprocess"
  testprefs=$(printf "$data/%s," "${sets[@]}")
  "$py" "$root/scripts/binarize.py" --source-lang $src --target-lang $tgt --trainpref "$data/train" \
    --validpref "$data/val" --testpref "${testprefs%,}" --spm-vocab "$vocab" --spm-dir "$run/spm" \
    ${lines:+--max-lines "$lines"} --destdir "$run/bin"
fi

[ $prepare_only = 0 ] || { say "done: $run/bin (--prepare-only)"; exit 0; }

ckpt=$run/checkpoints
if [ -e "$ckpt/train.done" ]; then say "3/5 train: $ckpt/train.done exists, skipped"; else
  say "3/5 train: $arch, $epochs epochs (resumes from checkpoint_last.pt if there is one)"
  "$bin/fairseq-train" "$run/bin" --user-dir "$root/fairseq_realformer" --arch "$arch" \
    --source-lang $src --target-lang $tgt --share-all-embeddings "${model[@]}" \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 5e-4 --lr-scheduler inverse_sqrt \
    --warmup-updates 1000 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 4096 --max-epoch "$epochs" --keep-last-epochs "$average" --save-dir "$ckpt" --seed 1 \
    --log-format simple --log-interval 50 --no-progress-bar ${precision[@]+"${precision[@]}"} \
    ${schedule[@]+"${schedule[@]}"} \
    ${train_extra[@]+"${train_extra[@]}"} \
    2>&1 | tee -a "$run/train.log"
  touch "$ckpt/train.done"
fi

if [ -e "$ckpt/checkpoint_avg.pt" ]; then say "4/5 average: $ckpt/checkpoint_avg.pt exists, skipped"; else
  say "4/5 average: the last $average epoch checkpoints"
  "$py" "$root/scripts/average_checkpoints.py" --inputs "$ckpt" --num-epoch-checkpoints "$average" \
    --output "$ckpt/checkpoint_avg.pt"
fi

# the validation set too (its BLEU chooses between settings; never a test set), then each test set
splits=(val "${sets[@]}") subsets=(valid)
for i in "${!sets[@]}"; do subsets+=("test$([ "$i" -gt 0 ] && echo "$i" || true)"); done  # fairseq's names
for i in "${!splits[@]}"; do
  name=${splits[$i]} subset=${subsets[$i]}
  out=$run/score/$name
  reference=$data/$name.$tgt.gz
  if [ -n "$lines" ]; then  # the reference of the first $lines sentences only
    reference=$run/$name.$tgt
    gzip -dc "$data/$name.$tgt.gz" | sed -n "1,${lines}p" > "$reference"
  fi
  if [ -e "$out/scores.txt" ]; then say "5/5 translate + score $name: $out exists, skipped"; continue; fi
  say "5/5 translate $name (beam 5) and score it"
  tokenized=()
  [ $published = 0 ] || tokenized=(--tokenized-reference "$run/bin/tok/$subset.$tgt")
  "$py" "$root/scripts/score.py" --data "$run/bin" --checkpoint "$ckpt/checkpoint_avg.pt" --gen-subset "$subset" \
    --source-lang $src --target-lang $tgt --reference "$reference" "${scoring[@]}" ${tokenized[@]+"${tokenized[@]}"} \
    --beam 5 --lenpen 1.0 --output-dir "$out" ${generate[@]+"${generate[@]}"} ${precision[@]+"${precision[@]}"} > /dev/null
done

say "done in ${SECONDS}s; translations in $run/score/SET/*.hyp.$tgt"
for name in "${splits[@]}"; do
  echo "$name:"
  cat "$run/score/$name/scores.txt"
done
