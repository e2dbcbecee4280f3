#!/usr/bin/env bash
# Multi30k (task 1) English -> German with RealFormer: joint sentencepiece BPE, fairseq-preprocess,
# fairseq-train, average the last checkpoints, beam search on test_2016_flickr and sacreBLEU.
# Each step is skipped when its output exists; an interrupted training resumes.
#
#   examples/multi30k/run.sh [DATA_DIR] [RUN_DIR] [-- fairseq-train flags...]
#   examples/multi30k/run.sh --tiny [DATA_DIR] [RUN_DIR]   # first 300 lines, tiny model (tests)
#
# DATA_DIR holds train.{en,de}.gz, val.{en,de}.gz, test_2016_flickr.{en,de}.gz (raw text, read in
# place; default ../shared/data/multi30k from the repository root). RUN_DIR: runs/multi30k.
# Sized for one GPU (minutes); on a CPU it runs too, slowly. Set ARCH, EPOCHS to change them;
# flags after -- go to fairseq-train last, so they win (e.g. -- --backbone pre-ln).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tiny=0
if [ "${1:-}" = "--tiny" ]; then tiny=1; shift; fi
positional=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do positional+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
train_extra=("$@")
set -- ${positional[@]+"${positional[@]}"}
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] || [ $# -gt 2 ]; then
  sed -n '2,12p' "$0" | cut -c3-
  exit 2
fi
data=${1:-$root/../shared/data/multi30k}
run=${2:-$root/runs/multi30k$([ $tiny = 1 ] && echo -tiny || true)}
arch=${ARCH:-realformer_iwslt_de_en}
src=en tgt=de

if [ $tiny = 1 ]; then
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
for split in train val test_2016_flickr; do
  for lang in $src $tgt; do
    [ -f "$data/$split.$lang.gz" ] || { echo "run.sh: error: $data/$split.$lang.gz not found (DATA_DIR)" >&2; exit 2; }
  done
done

say() { echo "[multi30k $(date +%H:%M:%S)] $*"; }
mkdir -p "$run"
say "data $data, output in $run, $arch, $epochs epochs${lines:+, first $lines lines}"

say "1/5 set-up: scripts/setup_env.sh"
"$root/scripts/setup_env.sh"
bin=${REALFORMER_VENV:-$root/.venv}/bin
py=$bin/python

if [ -e "$run/bin/dict.$tgt.txt" ]; then say "2/5 subwords + binarize: $run/bin exists, skipped"; else
  say "2/5 subwords + binarize: joint sentencepiece BPE ($vocab) on the raw training text, then fairseq-preprocess"
  "$py" "$root/scripts/binarize.py" --source-lang $src --target-lang $tgt --trainpref "$data/train" \
    --validpref "$data/val" --testpref "$data/test_2016_flickr" --spm-vocab "$vocab" --spm-dir "$run/spm" \
    ${lines:+--max-lines "$lines"} --destdir "$run/bin"
fi

ckpt=$run/checkpoints
if [ -e "$ckpt/train.done" ]; then say "3/5 train: $ckpt/train.done exists, skipped"; else
  say "3/5 train: $arch, $epochs epochs (resumes from checkpoint_last.pt if there is one)"
  "$bin/fairseq-train" "$run/bin" --user-dir "$root/fairseq_realformer" --arch "$arch" \
    --share-all-embeddings "${model[@]}" \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 5e-4 --lr-scheduler inverse_sqrt \
    --warmup-updates 1000 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 4096 --max-epoch "$epochs" --keep-last-epochs "$average" --save-dir "$ckpt" --seed 1 \
    --log-format simple --log-interval 50 --no-progress-bar ${train_extra[@]+"${train_extra[@]}"} \
    2>&1 | tee -a "$run/train.log"
  touch "$ckpt/train.done"
fi

if [ -e "$ckpt/checkpoint_avg.pt" ]; then say "4/5 average: $ckpt/checkpoint_avg.pt exists, skipped"; else
  say "4/5 average: the last $average epoch checkpoints"
  "$py" "$root/scripts/average_checkpoints.py" --inputs "$ckpt" --num-epoch-checkpoints "$average" \
    --output "$ckpt/checkpoint_avg.pt"
fi

reference=$data/test_2016_flickr.$tgt.gz
if [ -n "$lines" ]; then  # the reference of the first $lines test sentences only
  reference=$run/test_2016_flickr.$tgt
  gzip -dc "$data/test_2016_flickr.$tgt.gz" | sed -n "1,${lines}p" > "$reference"
fi
if [ -e "$run/score/scores.txt" ]; then say "5/5 translate + score: $run/score exists, skipped"; else
  say "5/5 translate test_2016_flickr (beam 5) and score it"
  "$py" "$root/scripts/score.py" --data "$run/bin" --checkpoint "$ckpt/checkpoint_avg.pt" \
    --source-lang $src --target-lang $tgt --reference "$reference" --bpe sentencepiece --detok none \
    --beam 5 --lenpen 1.0 --output-dir "$run/score.tmp" "${generate[@]}" > /dev/null
  rm -rf "$run/score" && mv "$run/score.tmp" "$run/score"
fi

say "done in ${SECONDS}s; translations in $run/score/test.hyp.$tgt"
cat "$run/score/scores.txt"
