#!/usr/bin/env bash
# Train a small RealFormer end to end on a synthetic language pair that the project generates
# itself (scripts/toy_corpus.py: no download), then average the last checkpoints, translate the
# test set with beam search and score it with sacreBLEU. Each step prints what it does and is
# skipped when its output exists; an interrupted training resumes from checkpoint_last.pt.
#
#   scripts/quickstart.sh              # output in runs/quickstart (a few minutes on 2 CPU cores)
#   scripts/quickstart.sh DIR          # output in DIR
#   scripts/quickstart.sh --ci [DIR]   # reduced size for the test suite (runs/quickstart-ci)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=cpu
if [ "${1:-}" = "--ci" ]; then mode=ci; shift; fi
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] || [ $# -gt 1 ]; then
  sed -n '2,9p' "$0" | cut -c3-
  exit 2
fi
if [ "$mode" = cpu ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  mode=gpu
fi
run=${1:-$root/runs/quickstart$([ "$mode" = ci ] && echo -ci || true)}

# Sizes: sentence pairs, model width/depth, tokens a batch, updates (the learning rate decays
# linearly to 0 at the last one), checkpoint interval; the last 2 checkpoints are averaged.
case $mode in
  ci)  train=4000;  dim=64;  layers=2; tokens=1024; updates=500;  interval=50 ;;
  cpu) train=20000; dim=128; layers=3; tokens=2048; updates=550;  interval=50 ;;
  gpu) train=50000; dim=256; layers=6; tokens=8192; updates=1500; interval=100 ;;
esac
# A model this small gains little from a second thread, and OpenMP threads that spin-wait for a
# busy core made training up to 20x slower on a shared 2-core machine: one thread, unless told.
if [ "$mode" != gpu ]; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi

say() { echo "[quickstart $(date +%H:%M:%S)] $*"; }
mkdir -p "$run"
say "output in $run ($mode settings: $train sentence pairs, d=$dim, $layers+$layers layers, $updates updates)"

say "1/6 set-up: scripts/setup_env.sh"
"$root/scripts/setup_env.sh"
bin=${REALFORMER_VENV:-$root/.venv}/bin
py=$bin/python
user_dir=$root/fairseq_realformer

if [ -e "$run/raw/test.tgt" ]; then say "2/6 corpus: $run/raw exists, skipped"; else
  say "2/6 corpus: synthetic en-like -> invented language, $train training pairs"
  rm -rf "$run/raw.tmp"
  "$py" "$root/scripts/toy_corpus.py" --out-dir "$run/raw.tmp" --train "$train"
  mv "$run/raw.tmp" "$run/raw"
fi

if [ -e "$run/bin/dict.tgt.txt" ]; then say "3/6 subwords + binarize: $run/bin exists, skipped"; else
  say "3/6 subwords + binarize: joint sentencepiece BPE, then fairseq-preprocess (scripts/binarize.py)"
  "$py" "$root/scripts/binarize.py" --source-lang src --target-lang tgt --trainpref "$run/raw/train" \
    --validpref "$run/raw/valid" --testpref "$run/raw/test" --spm-vocab 800 --spm-dir "$run/spm" --destdir "$run/bin"
fi

ckpt=$run/checkpoints
if [ -e "$ckpt/train.done" ]; then say "4/6 train: $ckpt/train.done exists, skipped"; else
  say "4/6 train: realformer_iwslt_de_en (residual attention on all paths, ADMIN), $updates updates$([ -e "$ckpt/checkpoint_last.pt" ] && echo ", resuming from checkpoint_last.pt" || true)"
  "$bin/fairseq-train" "$run/bin" --user-dir "$user_dir" --arch realformer_iwslt_de_en \
    --encoder-layers "$layers" --decoder-layers "$layers" --share-all-embeddings \
    --encoder-embed-dim "$dim" --decoder-embed-dim "$dim" \
    --encoder-ffn-embed-dim $((2 * dim)) --decoder-ffn-embed-dim $((2 * dim)) \
    --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1 \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 3e-3 --lr-scheduler polynomial_decay \
    --warmup-updates 100 --total-num-update "$updates" --max-update "$updates" \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens "$tokens" \
    --save-interval-updates "$interval" --keep-interval-updates 2 --no-epoch-checkpoints \
    --save-dir "$ckpt" --seed 1 --num-workers 0 --log-format simple --log-interval 25 --no-progress-bar \
    2>&1 | tee -a "$run/train.log"
  touch "$ckpt/train.done"
fi

if [ -e "$ckpt/checkpoint_avg.pt" ]; then say "5/6 average: $ckpt/checkpoint_avg.pt exists, skipped"; else
  say "5/6 average: the last 2 checkpoints (every $interval updates)"
  "$py" "$root/scripts/average_checkpoints.py" --inputs "$ckpt" --num-update-checkpoints 2 \
    --output "$ckpt/checkpoint_avg.pt"
fi

if [ -e "$run/score/scores.txt" ]; then say "6/6 translate + score: $run/score exists, skipped"; else
  say "6/6 translate the test set (beam 4) and score it"
  "$py" "$root/scripts/score.py" --data "$run/bin" --checkpoint "$ckpt/checkpoint_avg.pt" \
    --user-dir "$user_dir" --source-lang src --target-lang tgt --reference "$run/raw/test.tgt" \
    --bpe sentencepiece --detok none --beam 4 --lenpen 1.0 --output-dir "$run/score.tmp" > /dev/null
  rm -rf "$run/score" && mv "$run/score.tmp" "$run/score"
fi

say "done in ${SECONDS}s; translations in $run/score/test.hyp.tgt"
cat "$run/score/scores.txt"
