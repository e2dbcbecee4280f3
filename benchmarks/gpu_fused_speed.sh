#!/usr/bin/env bash
# Issue 41's GPU run, in one command under the device tool's limits (≤ 8 minutes on one H100/H200):
#   1. both fused residual attentions (fused, concat) against the eager chain on this device
#      (tests/test_fused_attention.py: outputs and every gradient, decoding, beam search, in float32
#      through the memory-efficient kernel; concat's saved memory linear in depth);
#   2. benchmarks/speed.py in bf16 (~4k and ~16k target tokens a batch) and fp16 (~4k), 6L-6L and
#      18L-18L, lengths 30 and 100: fairseq, post-ln, admin, realformer eager and realformer concat
#      with the CUDA kernels of a training step, the SDPA backend that ran, and how much of a step the
#      GPU was busy (--profile: under 100 %, the step waits on the host). fused was timed on the first
#      run (benchmarks/RESULTS.md) and is left out for time.
# Each speed run writes its JSON after every cell and stops at its share of the time, so a run cut
# short keeps what it measured. The carried wheels (.whl, e.g. ve-fairseq for the device's
# Python) are installed first when fairseq is missing.
#
#   benchmarks/gpu_fused_speed.sh [OUT_DIR]             # default benchmarks/results
#   benchmarks/gpu_fused_speed.sh --rehearse [OUT_DIR]  # the same steps on a CPU, tiny: proves it runs
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rehearse=0
if [ "${1:-}" = --rehearse ]; then rehearse=1; shift; fi
out=${1:-$root/benchmarks/results}
py=${PYTHON:-python3}
say() { echo "[gpu-fused $(date +%H:%M:%S)] $*"; }
mkdir -p "$out"
if [ -d "$root/.whl" ] && ! "$py" -c "import fairseq" 2>/dev/null; then
  say "installing the carried wheels ($root/.whl) into /tmp/site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$root"/.whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
variants=fairseq,post-ln,admin,realformer+eager,realformer+concat
if [ $rehearse = 1 ]; then
  device=(--device cpu --sizes 6L-6L --lengths 30 --steps 1 --repeats 1 --gen-sentences 2)
  runs=("fp32 128,256 120")
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  device=(--sizes 6L-6L,18L-18L --lengths 30,100 --steps 5 --repeats 3 --gen-sentences 32)
  runs=("bf16 4096,16384 300" "fp16 4096 190")  # dtype, target tokens per batch, seconds at most
fi
"$py" -c "import torch, fairseq; print('torch', torch.__version__, 'fairseq', fairseq.__version__)"

say "1/2 fused and concat against eager on this device: tests/test_fused_attention.py"
"$py" -m pytest -q -p no:cacheprovider -rfs "$root/tests/test_fused_attention.py" >"$out/gpu-fused-tests.log" 2>&1 ||
  say "some tests failed: $out/gpu-fused-tests.log"
tail -n 5 "$out/gpu-fused-tests.log"

for run in "${runs[@]}"; do
  read -r dtype tokens seconds <<<"$run"
  say "2/2 speed.py --dtype $dtype --tokens-per-batch $tokens (at most $seconds s): $variants"
  timeout "$seconds" "$py" "$root/benchmarks/speed.py" --dtype "$dtype" --variants "$variants" --profile \
    --tokens-per-batch "$tokens" "${device[@]}" --json "$out/gpu-speed-fused-concat-$dtype.json" ||
    say "speed.py --dtype $dtype stopped (exit $?): $out/gpu-speed-fused-concat-$dtype.json holds the cells it finished"
done
say "done: $out"
