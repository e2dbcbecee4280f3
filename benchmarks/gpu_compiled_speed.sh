#!/usr/bin/env bash
# Issue 52's GPU run, in one command under the device tool's limits (≤ 8 minutes on one H100):
#   1. benchmarks/speed.py --profile in bf16, 6L-6L and 18L-18L, lengths 30 and 100, ~4k and ~16k
#      target tokens a batch: fairseq, fairseq with its own layers compiled by hand, admin and
#      realformer, each eager and with --compile-layers: training tokens/s, peak memory, the CUDA
#      kernels of a step and how much of it the GPU is busy; each variant's first step, which
#      compiles, timed apart;
#   2. benchmarks/compiled_train.py: fairseq-train --bf16, realformer_wmt_en_de (6L-6L), 200 updates
#      on the toy corpus, compiled against eager: words/s and the loss at the end.
# Each step writes its JSON as it goes and stops at its share of the time, so a run cut short keeps
# what it measured. Inductor's cache (TORCHINDUCTOR_CACHE_DIR) is shared by both steps.
#
#   benchmarks/gpu_compiled_speed.sh --wheels           # here, once: fairseq & co. for the device's Python 3.12 into .whl
#   benchmarks/gpu_compiled_speed.sh [OUT_DIR]          # on the GPU (default benchmarks/results); carry .whl
#   benchmarks/gpu_compiled_speed.sh --rehearse [OUT]   # the same steps on a CPU, tiny: proves it runs
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
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
mkdir -p "$out"
if [ -d "$root/.whl" ] && ! "$py" -c "import fairseq" 2>/dev/null; then
  say "installing the carried wheels ($root/.whl) into /tmp/site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$root"/.whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/site/bin:$PATH  # fairseq-train
fi
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
variants=fairseq,fairseq+compiled,admin,admin+compiled,realformer,realformer+compiled
if [ $rehearse = 1 ]; then
  speed=(--device cpu --dtype fp32 --sizes 6L-6L --lengths 30 --tokens-per-batch 120 --steps 1 --repeats 1)
  train=(--tiny --updates 20 --skip 10)
  seconds=(600 300)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  speed=(--dtype bf16 --sizes 6L-6L,18L-18L --lengths 30,100 --tokens-per-batch 4096,16384 --steps 5 --repeats 3)
  train=(--bf16 --updates 200 --skip 50)
  seconds=(330 130)  # speed.py, compiled_train.py: at most
fi
"$py" -c "import torch, fairseq; print('torch', torch.__version__, 'fairseq', fairseq.__version__)"

say "1/2 speed.py ${speed[*]} (at most ${seconds[0]} s): $variants"
timeout "${seconds[0]}" "$py" "$root/benchmarks/speed.py" --variants "$variants" --profile --gen-sentences 0 \
  "${speed[@]}" --json "$out/gpu-speed-compiled.json" ||
  say "speed.py stopped (exit $?): $out/gpu-speed-compiled.json holds the cells it finished"

say "2/2 compiled_train.py ${train[*]} (at most ${seconds[1]} s)"
timeout "${seconds[1]}" "$py" "$root/benchmarks/compiled_train.py" "${train[@]}" --work /tmp/compiled-train \
  --json "$out/gpu-compiled-train.json" || say "compiled_train.py stopped (exit $?)"
say "done: $out"
