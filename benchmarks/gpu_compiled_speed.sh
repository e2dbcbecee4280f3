#!/usr/bin/env bash
# Does --compile-layers make RealFormer train faster than fairseq's Transformer on a GPU? One
# command for a lent GPU's few minutes, which answers that first and keeps its own time:
#   1. benchmarks/speed.py --profile, bf16, with a budget of its share (benchmarks/budget.py): first
#      fairseq (eager) and realformer+compiled at 6L-6L, length 30, ~4k target tokens, each in the
#      JSON the moment it is measured, with its compile time and first step; then realformer eager,
#      fairseq+compiled (fairseq's own layers compiled by hand), admin, admin+compiled; that cell's
#      peak memory; then ~16k tokens, 18L-18L, length 100. A variant starts only if its expected
#      time fits (its compile time seen so far; before any, a guess of 120 s); what did not fit is
#      in the JSON's "skipped", with the reason.
#   2. benchmarks/compiled_train.py in what is left: fairseq-train --bf16, realformer_wmt_en_de
#      (6L-6L), 200 updates on the toy corpus, eager then compiled: words/s and the loss at the end.
#
# The plan, from one H200's times (2026-11-28, benchmarks/RESULTS.md "Compiled layers"): machine
# start ~30 s, wheels 15 s, imports 10 s; realformer+compiled's first step 125 s (compiling 117 s),
# fairseq+compiled's 105 s; any timing without compiling 2-10 s; memory in-process, seconds.
#   first 3 minutes: fairseq and realformer+compiled at 6L-6L/30/~4k, realformer eager beside them;
#   by 8 minutes (450 s): admin eager, the first cell's memory, then ~16k tokens and 18L-18L (the
#     plugin's graphs take every shape); fairseq+compiled and admin+compiled (~150 s each expected)
#     only with 600 s; compiled_train.py's ~130 s may end inside its compiled run's compiling.
#
#   benchmarks/gpu_compiled_speed.sh --wheels                   # here, once: fairseq & co. for the device's Python 3.12 into .whl
#   benchmarks/gpu_compiled_speed.sh [OUT_DIR] [SECONDS]        # on the GPU (default benchmarks/results, 450 s); carry .whl
#   benchmarks/gpu_compiled_speed.sh --rehearse [OUT] [SECONDS] # the same steps on a CPU, tiny (default 360 s)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3  # the device has no .venv: its own python3, with the carried wheels
say() { echo "[gpu-compiled $(date +%H:%M:%S)] $*"; }

if [ "${1:-}" = --wheels ]; then
  # what the device's image lacks (its python3 has torch, numpy, sacrebleu, scikit-learn, regex)
  grep -qx '/.whl/' "$root/.git/info/exclude" 2>/dev/null || echo /.whl/ >>"$root/.git/info/exclude"
  platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  say "downloading ve-fairseq, hydra-core, omegaconf, bitarray for CPython 3.12 into $root/.whl"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$root/.whl" ve-fairseq==0.12.3 hydra-core==1.3.8 omegaconf==2.3.1 bitarray==3.12.3
  "$py" -m pip wheel -q --no-deps -w "$root/.whl" antlr4-python3-runtime==4.9.3  # an sdist only: built here
  ls -la "$root/.whl"
  exit 0
fi
rehearse=0
if [ "${1:-}" = --rehearse ]; then rehearse=1; shift; fi
out=${1:-$root/benchmarks/results}
total=${2:-$([ $rehearse = 1 ] && echo 360 || echo 450)}
mkdir -p "$out"
start=$SECONDS
if [ -d "$root/.whl" ] && ! "$py" -c "import fairseq" 2>/dev/null; then
  say "installing the carried wheels ($root/.whl) into /tmp/site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$root"/.whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/site/bin:$PATH  # fairseq-train
fi
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
# the question's pair first (speed.py measures fairseq, then the others in this order)
variants=fairseq,realformer+compiled,realformer,fairseq+compiled,admin,admin+compiled
if [ $rehearse = 1 ]; then
  speed=(--device cpu --dtype fp32 --sizes 6L-6L --lengths 30 --tokens-per-batch 120 --steps 1 --repeats 1)
  train=(--tiny --updates 20 --skip 10)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  speed=(--dtype bf16 --sizes 6L-6L,18L-18L --lengths 30,100 --tokens-per-batch 4096,16384 --steps 5 --repeats 3)
  train=(--bf16 --updates 200 --skip 50)
fi
"$py" -c "import torch, fairseq; print('torch', torch.__version__, 'fairseq', fairseq.__version__)"
# speed.py's share: 70 % of what is left; its budget keeps 20 s for starting and the report, and
# the hard limit (timeout) 30 s beyond its share only stops an expectation gone badly wrong
share=$(((total - (SECONDS - start)) * 7 / 10))
say "1/2 speed.py ${speed[*]}, budget $((share - 20)) s: $variants"
timeout $((share + 30)) "$py" "$root/benchmarks/speed.py" --variants "$variants" --profile --gen-sentences 0 \
  --budget $((share - 20)) "${speed[@]}" --json "$out/gpu-speed-compiled.json" ||
  say "speed.py stopped (exit $?): $out/gpu-speed-compiled.json holds what it measured"

left=$((total - (SECONDS - start)))
say "2/2 compiled_train.py ${train[*]} (at most $left s)"
timeout "$((left > 10 ? left : 10))" "$py" "$root/benchmarks/compiled_train.py" "${train[@]}" --work /tmp/compiled-train \
  --json "$out/gpu-compiled-train.json" || say "compiled_train.py stopped (exit $?): its JSON holds the runs it finished"

say "done in $((SECONDS - start)) s: $out"
"$py" "$root/benchmarks/speed.py" --summary "$out/gpu-speed-compiled.json" || true
