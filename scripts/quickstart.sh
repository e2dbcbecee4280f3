#!/usr/bin/env bash
# Train a small RealFormer end to end on a synthetic language pair that the project generates
# itself (scripts/toy_corpus.py: no download), then average the last checkpoints, translate the
# test set with beam search and score it with sacreBLEU. Each step prints one line saying what it
# does (training: the loss every 25 updates) and is skipped when its output exists; an interrupted
# training resumes from checkpoint_last.pt. Each tool's full output goes to DIR/logs/.
#
#   scripts/quickstart.sh              # output in runs/quickstart (a few minutes on 2 CPU cores)
#   scripts/quickstart.sh DIR          # output in DIR
#   scripts/quickstart.sh --ci [DIR]   # reduced size for the test suite (runs/quickstart-ci)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=cpu
if [ "${1:-}" = "--ci" ]; then mode=ci; shift; fi
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] || [ $# -gt 1 ]; then
  sed -n '2,10p' "$0" | cut -c3-
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
logs=$run/logs
mkdir -p "$logs"

failed() {  # the end of log $1, then stop
  tail -n 15 "$1" >&2
  say "failed: the end of $1 is above"
  exit 1
}

# Run a command with all its output appended to log $1.
logged() {
  local log=$1
  shift
  "$@" >> "$log" 2>&1 || failed "$log"
}

# fairseq-train's log (kept whole in the log file) -> a line every 25 updates and at each validation.
train_progress() {
  local line valid_re="valid on 'valid' subset \| loss ([0-9.]+) .*\| num_updates ([0-9]+)"
  while IFS= read -r line; do
    if [[ $line == *"| train_inner |"* && $line =~ loss=([0-9.]+),.*num_updates=([0-9]+),.*wall=([0-9]+) ]]; then
      printf '    update %4d/%d  train loss %6.3f  (%s s)\n' \
        "${BASH_REMATCH[2]}" "$updates" "${BASH_REMATCH[1]}" "${BASH_REMATCH[3]}"
    elif [[ $line =~ $valid_re ]]; then
      printf '    update %4d/%d  valid loss %6.3f\n' "${BASH_REMATCH[2]}" "$updates" "${BASH_REMATCH[1]}"
    fi
  done
}

say "output in $run ($mode settings: $train sentence pairs, d=$dim, $layers+$layers layers, $updates updates)"

venv=${REALFORMER_VENV:-$root/.venv}
say "1/6 set-up: the environment $venv (scripts/setup_env.sh; minutes the first time) -> $logs/setup.log"
logged "$logs/setup.log" "$root/scripts/setup_env.sh"
py=$venv/bin/python
user_dir=$root/fairseq_realformer

if [ -e "$run/raw/test.tgt" ]; then say "2/6 corpus: $run/raw exists, skipped"; else
  say "2/6 corpus: synthetic en-like -> invented language, $train training pairs -> $logs/corpus.log"
  rm -rf "$run/raw.tmp"
  logged "$logs/corpus.log" "$py" "$root/scripts/toy_corpus.py" --out-dir "$run/raw.tmp" --train "$train"
  mv "$run/raw.tmp" "$run/raw"
fi

if [ -e "$run/bin/dict.tgt.txt" ]; then say "3/6 subwords + binarize: $run/bin exists, skipped"; else
  say "3/6 subwords + binarize: joint sentencepiece BPE, then fairseq-preprocess -> $logs/binarize.log"
  logged "$logs/binarize.log" "$py" "$root/scripts/binarize.py" --source-lang src --target-lang tgt \
    --trainpref "$run/raw/train" --validpref "$run/raw/valid" --testpref "$run/raw/test" --spm-vocab 800 \
    --spm-dir "$run/spm" --destdir "$run/bin"
fi

ckpt=$run/checkpoints
if [ -e "$ckpt/train.done" ]; then say "4/6 train: $ckpt/train.done exists, skipped"; else
  resume=$([ -e "$ckpt/checkpoint_last.pt" ] && echo ", resuming from checkpoint_last.pt" || true)
  say "4/6 train: realformer_iwslt_de_en (residual attention on all paths, ADMIN), $updates updates$resume -> $logs/train.log"
  "$venv/bin/fairseq-train" "$run/bin" --user-dir "$user_dir" --arch realformer_iwslt_de_en \
    --encoder-layers "$layers" --decoder-layers "$layers" --share-all-embeddings \
    --encoder-embed-dim "$dim" --decoder-embed-dim "$dim" \
    --encoder-ffn-embed-dim $((2 * dim)) --decoder-ffn-embed-dim $((2 * dim)) \
    --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1 \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 3e-3 --lr-scheduler polynomial_decay \
    --warmup-updates 100 --total-num-update "$updates" --max-update "$updates" \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens "$tokens" \
    --save-interval-updates "$interval" --keep-interval-updates 2 --no-epoch-checkpoints \
    --save-dir "$ckpt" --seed 1 --num-workers 0 --log-format simple --log-interval 25 --no-progress-bar \
    2>&1 | tee -a "$logs/train.log" | train_progress || failed "$logs/train.log"
  touch "$ckpt/train.done"
fi

if [ -e "$ckpt/checkpoint_avg.pt" ]; then say "5/6 average: $ckpt/checkpoint_avg.pt exists, skipped"; else
  say "5/6 average: the last 2 checkpoints (every $interval updates) -> $logs/average.log"
  logged "$logs/average.log" "$py" "$root/scripts/average_checkpoints.py" --inputs "$ckpt" \
    --num-update-checkpoints 2 --output "$ckpt/checkpoint_avg.pt"
fi

if [ -e "$run/score/scores.txt" ]; then say "6/6 translate + score: $run/score exists, skipped"; else
  say "6/6 translate + score: the test set with beam 4 (fairseq-generate), then sacreBLEU -> $logs/score.log"
  logged "$logs/score.log" "$py" "$root/scripts/score.py" --data "$run/bin" --checkpoint "$ckpt/checkpoint_avg.pt" \
    --user-dir "$user_dir" --source-lang src --target-lang tgt --reference "$run/raw/test.tgt" \
    --bpe sentencepiece --detok none --beam 4 --lenpen 1.0 --output-dir "$run/score.tmp"
  rm -rf "$run/score" && mv "$run/score.tmp" "$run/score"
fi

say "done in ${SECONDS}s"
head -n 1 "$run/score/scores.txt"
cat <<EOF
Everything is in $run:
  raw/                  the synthetic corpus (train, valid, test .src/.tgt)
  spm/spm.model         the joint sentencepiece model
  bin/                  fairseq's binary data and dictionaries
  checkpoints/          the last 2 checkpoints, checkpoint_last.pt, checkpoint_best.pt, and
                        checkpoint_avg.pt (their average: the model scored)
  score/test.hyp.tgt    the test set's translations; both scores in score/scores.txt
  logs/                 each step's full output (fairseq-train's: logs/train.log)
To translate your own sentences with it: docs/python-api.md
EOF
