#!/usr/bin/env bash
# The learning-rate and depth study on Multi30k en->de (studies/STUDY.md), every step resumable:
#   1. the sweep: five variants at peak lr 2e-3, 4e-3, 8e-3, seed 1; then seeds 2 and 3 of each
#      variant at its best rate on validation BLEU;
#   2. depth: the five variants at 12+12 layers, lr 2e-3 and 4e-3, seed 1, each run's checkpoints
#      also scored with dropout off and on (--dropout-gap: a deep Post-LN can break with it off only);
#      then seeds 2 and 3 of the variants that train there (pre-ln, admin, realformer), each at its
#      best 12+12 rate on validation BLEU;
#   3. the post-ln-realformer rows of the 18+18 depth-stability tables (lr 3e-3 and 6e-3), added to
#      the committed tables with post-ln re-run as the control;
#   4. the paper's depth: admin and realformer at 18+18 layers, lr 1e-3 and 2e-3, seed 1, with the
#      dropout gap; then seeds 2 and 3 of each at its best 18+18 rate on validation BLEU (the 2e-3
#      runs of seed 1, committed first as a study of their own, count as this sweep's).
#   5. depth settled (issue 69): seeds 4 and 5 of admin and realformer at 18+18 (at 2e-3, their
#      rate), and, as their 2e-3 is at the edge of stage 4's rates, 4e-3 seed 1 of each (--widen: a
#      better 4e-3 would take seeds 2-5 there); beside them, on the cores they leave, pre-ln and
#      deepnorm at 18+18, lr 2e-3 and 4e-3, seed 1, and the rate beyond the better one's edge (1e-3
#      or 8e-3, --widen); then seeds 2 and 3 of each at its best of the three.
#      Always float32, as the committed 18+18 study: studies/lr_depth_study.sh --stages 5
#   6. residual attention on Pre-LN (issue 86): pre-ln-realformer at 18+18, lr 2e-3, 1e-3 and 4e-3,
#      seed 1 (--widen), then seeds 2-5 at its best; and seeds 4 and 5 of pre-ln at its rate (2e-3),
#      into the committed pre-ln/deepnorm study. Float32, as stage 5:
#      studies/lr_depth_study.sh --stages 6,7 --jobs 2
#   7. DeepNorm with a longer warm-up (issue 86), after the side-by-side with torchscale found its
#      collapse the method's: 1,600 warm-up updates, 4x the recipe's 400 (torchscale's translation
#      example, the DeepNet authors', warms up over 4,000, more than this recipe's 2,640 in all: so
#      scaled, not copied), at 18+18, seed 1, lr 1e-3 (its rate with 400) and 2e-3 (the others');
#      then seeds 2 and 3 at the better on validation BLEU. Float32, after stage 6.
#   8. the residual-stream methods (issue 97) at 4+4 on Pre-LN, their papers' backbone: Hyper-Connections
#      and mHC (4 streams) and DenseFormer (1x1), at 4e-3 (Pre-LN's best 4+4 rate in stage 1), seed 1,
#      beside Pre-LN itself trained again by the same code. Float32, independent of stages 6-7. DenseFormer
#      (about Pre-LN's cost) and Hyper-Connections train first, then Pre-LN, then mHC (~0.4x Pre-LN's
#      words/s, more than a session on the 2-core EPYC): the runs that end within a session come first.
#   9. Pre-LN with stage 7's 1,600 warm-up updates (issue 86): DeepNorm trained there, but every other
#      18+18 variant warmed up over 400, so the warm-up and the method are confounded. pre-ln at 18+18,
#      seed 1, lr 2e-3 (its rate with 400) and 4e-3, then seeds 2 and 3 at the better. Float32, after 7.
# Stop it any time; run it again to go on (finished runs are skipped, a stopped one resumes).
# --jobs N trains N runs side by side, one thread each; --jobs 1, one on every core. On the 2-core
# AMD EPYC VM an 18+18 run makes ~950 tokens/s alone and ~660 beside another (2026-12-02): --jobs 2
# trains ~40% more in all, each run ~4 hours rather than ~3 (20 epochs, 132 updates each).
#
#   studies/lr_depth_study.sh [--precision bf16|fp32] [--jobs N] [--out DIR] [--machine TEXT] [--stages 1,2,3,4,5,6,7,8,9]
# The runs outlast a session and a checkout: set REALFORMER_RUNS to a folder outside the checkout (the
# default --out; else the checkout's runs/), and a study started again from a fresh clone resumes
# every unfinished run from its last epoch checkpoint. On a CPU each training gets glibc's allocator
# settings of common/allocator.py (~1.35x faster, the same numbers; REALFORMER_MALLOC=off: without).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
precision=bf16 jobs=2 out=${REALFORMER_RUNS:-$root/runs} machine= stages=1,2,3,4
while [ $# -gt 0 ]; do
  case "$1" in
    --precision) precision=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --machine) machine=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    *) echo "lr_depth_study.sh: error: unknown option $1 (--precision, --jobs, --out, --machine, --stages)" >&2; exit 2 ;;
  esac
done
case "$precision" in
  bf16) flag=(--bf16) tag=-bf16 ;;
  fp32) flag=() tag= ;;
  *) echo "lr_depth_study.sh: error: --precision $precision: bf16 or fp32" >&2; exit 2 ;;
esac
py=${REALFORMER_VENV:-$root/.venv}/bin/python
[ -n "$machine" ] || machine=$(cd "$root" && "$py" -c "from common.host import host; print(host())")
results=$root/studies/results
variants=post-ln,pre-ln,admin,realformer,post-ln-realformer
say() { echo "[study $(date +%H:%M:%S)] $*"; }
stage() { [[ ",$stages," == *",$1,"* ]]; }
# nice ranks processes only inside a session where Linux groups sessions (autogroup): started with
# setsid, the study's session would take an equal share of the cores however niced; make it yield
echo 19 2>/dev/null > /proc/self/autogroup || true

if stage 1; then
say "1/4 learning-rate sweep, $precision, $jobs trainings side by side, in $out/lr-sweep"
nice -n 19 "$py" "$root/studies/quality.py" --preset cpu ${flag[@]+"${flag[@]}"} --lr 2e-3,4e-3,8e-3 --seeds 1 \
  --best-seeds 2,3 --variants $variants --jobs "$jobs" --out "$out/lr-sweep" --machine "$machine" \
  --json "$results/cpu-quality-lr-sweep-multi30k-en-de$tag.json" --figures "$root/docs/figures/lr-sweep"
fi

if stage 2; then
say "2/4 depth: 12+12 layers in $out/depth-12"
nice -n 19 "$py" "$root/studies/quality.py" --preset cpu ${flag[@]+"${flag[@]}"} --layers 12 --lr 2e-3,4e-3 \
  --seeds 1 --best-seeds 2,3 --best-variants pre-ln,admin,realformer --variants $variants --jobs "$jobs" \
  --dropout-gap --out "$out/depth-12" --machine "$machine" \
  --json "$results/cpu-quality-depth-12-multi30k-en-de$tag.json" --figures "$root/docs/figures/lr-sweep" \
  --beside "$results/cpu-quality-lr-sweep-multi30k-en-de$tag.json"
fi

if stage 3; then for lr in 3e-3 6e-3; do
  say "3/4 depth stability, 18+18 layers, lr $lr: post-ln-realformer and a post-ln control"
  nice -n 19 "$py" "$root/studies/depth_stability.py" --variants post-ln-realformer,post-ln --lr $lr \
    --out "$out/depth-stability-$lr" --add-to "$results/cpu-depth-stability-lr$lr.json" --machine "$machine"
done; fi

if stage 4; then
say "4/4 the paper's depth: admin and realformer at 18+18 layers in $out/depth-18"
nice -n 19 "$py" "$root/studies/quality.py" --preset cpu ${flag[@]+"${flag[@]}"} --layers 18 --lr 1e-3,2e-3 \
  --seeds 1 --best-seeds 2,3 --variants admin,realformer --jobs "$jobs" --dropout-gap --out "$out/depth-18" \
  --machine "$machine" --json "$results/cpu-quality-depth-18-multi30k-en-de$tag.json"
fi
# stages 5-7: float32 whatever --precision says, as the committed 18+18 study's runs are
depth18=(--preset cpu --layers 18 --seeds 1 --jobs "$jobs" --dropout-gap --out "$out/depth-18" --machine "$machine")
if stage 5; then
say "5/5 depth settled at 18+18 in $out/depth-18: seeds 4, 5 of admin and realformer, beside them pre-ln and deepnorm"
# side by side into one --out, the two studies train --jobs runs between them: the first starts a
# minute ahead to take its slots (its runs resume first), and a core it leaves is the second's at once
nice -n 19 "$py" "$root/studies/quality.py" "${depth18[@]}" --lr 1e-3,2e-3 --widen --best-seeds 2,3,4,5 --variants admin,realformer \
  --json "$results/cpu-quality-depth-18-multi30k-en-de.json" &
first=$!
sleep 60
nice -n 19 "$py" "$root/studies/quality.py" "${depth18[@]}" --lr 2e-3,4e-3 --widen --best-seeds 2,3 --variants pre-ln,deepnorm \
  --json "$results/cpu-quality-depth-18-pre-ln-deepnorm-multi30k-en-de.json"
wait "$first"
fi
if stage 6; then
say "6/6 residual attention on Pre-LN at 18+18 in $out/depth-18: pre-ln-realformer's rate and seeds, pre-ln's seeds 4, 5"
# 2e-3 first: the rate of every other 18+18 variant but deepnorm, compared first
nice -n 19 "$py" "$root/studies/quality.py" "${depth18[@]}" --lr 2e-3,1e-3,4e-3 --widen --best-seeds 2,3,4,5 \
  --variants pre-ln-realformer --json "$results/cpu-quality-depth-18-pre-ln-realformer-multi30k-en-de.json" &
first=$!
sleep 60
nice -n 19 "$py" "$root/studies/quality.py" "${depth18[@]}" --lr 2e-3,4e-3 --widen --best-seeds 2,3,4,5 \
  --best-variants pre-ln --variants pre-ln,deepnorm \
  --json "$results/cpu-quality-depth-18-pre-ln-deepnorm-multi30k-en-de.json"
wait "$first"
fi
if stage 7; then
say "7/7 deepnorm at 18+18 with 1,600 warm-up updates (4x the recipe's) in $out/depth-18"
nice -n 19 "$py" "$root/studies/quality.py" "${depth18[@]}" --warmup 1600 --lr 1e-3,2e-3 --best-seeds 2,3 \
  --variants deepnorm --json "$results/cpu-quality-depth-18-deepnorm-warmup-1600-multi30k-en-de.json"
fi
if stage 8; then
say "8/8 the residual-stream methods at 4+4 beside Pre-LN in $out/residual-streams-4"
nice -n 19 "$py" "$root/studies/quality.py" --preset cpu --lr 4e-3 --seeds 1 --jobs "$jobs" --out "$out/residual-streams-4" \
  --variants pre-ln-denseformer,pre-ln-hyper-connections,pre-ln,pre-ln-mhc --machine "$machine" \
  --json "$results/cpu-quality-residual-streams-4-multi30k-en-de.json"
fi
if stage 9; then
say "9/9 pre-ln at 18+18 with 1,600 warm-up updates (stage 7's) in $out/depth-18"
nice -n 19 "$py" "$root/studies/quality.py" "${depth18[@]}" --warmup 1600 --lr 2e-3,4e-3 --best-seeds 2,3 \
  --variants pre-ln --json "$results/cpu-quality-depth-18-pre-ln-warmup-1600-multi30k-en-de.json"
fi
say "done"
