#!/usr/bin/env bash
# Does RealFormer, with the fast update (its default) and --compile-layers, train faster than
# fairseq's own Transformer in fairseq-train on a GPU? One command for a lent GPU's few minutes,
# which answers that first and keeps its own time. Every measurement is benchmarks/train_update.py:
# fairseq-train itself, a process a configuration, fairseq's `transformer` without --user-dir; each
# run in its JSON the moment it ends; a run starts only if its expected time fits (budget.py), and
# what does not is in the JSON's "skipped" with the reason. Every run: 200 updates on the toy
# corpus, --clip-norm 1.0, words/s after update 50 (cuDNN attention's first batch shapes are slow),
# ATen ops (updates 4-5) and host ms per phase, the loss after update 200, peak GPU memory.
#   1. gpu-train-update-fp16.json: 6L-6L d=512, ~4k target tokens an update, --fp16 (the WMT'14
#      recipe's precision): fairseq, then realformer+compiled (the question); then fairseq's other
#      ways, whose fastest is fairseq's best: cuDNN attention off, float32, float32 with cuDNN
#      attention off; then realformer eager (the fast update alone) and realformer --fairseq-update.
#   2. gpu-train-update-18L.json, in what is left: 18L-18L d=512, ~16k tokens: fairseq float32,
#      realformer+compiled --bf16 (the plugin's autocast; fairseq's own --bf16 needs a TPU),
#      realformer+compiled float32, fairseq --fp16 with cuDNN attention off, realformer --bf16.
# On one H200 (benchmarks/RESULTS.md) an eager run took ~35 s in all, a compiled one ~160 s (its
# first step 125 s): step 1 ends in ~7 minutes, and step 2's compiled runs (~200 s each, cold
# compiles) do not fit in the default 480 s: they are skipped, with the reason.
#
#   benchmarks/gpu_compiled_speed.sh --wheels                   # here, once: fairseq & co. for the device's Python 3.12 into .whl
#   benchmarks/gpu_compiled_speed.sh [OUT_DIR] [SECONDS]        # on the GPU (default benchmarks/results, 480 s); carry .whl
#   benchmarks/gpu_compiled_speed.sh --rehearse [OUT] [SECONDS] # the same steps on a CPU, tiny, float32/bf16 (default 600 s)
#   python benchmarks/train_update.py --summary OUT/gpu-train-update-fp16.json   # its tables again
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
total=${2:-$([ $rehearse = 1 ] && echo 600 || echo 480)}
mkdir -p "$out"
start=$SECONDS
if [ -d "$root/.whl" ] && ! "$py" -c "import fairseq" 2>/dev/null; then
  say "installing the carried wheels ($root/.whl) into /tmp/site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$root"/.whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/site/bin:$PATH  # fairseq-train
fi
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
# one inductor cache for both steps: a compiled run reuses what an earlier one compiled for the
# same width and precision (the layers' graphs take every depth and batch shape)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
work=${TRAIN_UPDATE_WORK:-/tmp/train-update}  # the toy corpus, binarised once, and every run's log
if [ $rehearse = 1 ]; then
  # one core of a CPU: tiny width, a few hundred tokens, float32 (a CPU has no --fp16); width 36,
  # not 16: at 16, a length the toy corpus's sentences also have, the compiled layers compiled
  # twice (10 graphs, not 5: benchmarks/RESULTS.md)
  first=(--device cpu --precision fp32 --sizes 6L-6L:36 --tokens 512 --updates 16 --skip 8 --log-interval 2
    --configs fairseq,realformer+compiled,realformer,realformer-fairseq-update)
  second=(--device cpu --precision fp32 --sizes 18L-18L:36 --tokens 1024 --updates 16 --skip 8 --log-interval 2
    --configs fairseq,realformer+compiled@bf16,realformer+compiled,realformer@bf16)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  first=(--device cuda --precision fp16 --sizes 6L-6L --tokens 4096 --updates 200 --skip 50 --log-interval 10
    --configs fairseq,realformer+compiled,fairseq/cudnn-off,fairseq@fp32,fairseq@fp32/cudnn-off,realformer,realformer-fairseq-update)
  second=(--device cuda --precision fp32 --sizes 18L-18L --tokens 16384 --updates 200 --skip 50 --log-interval 10
    --configs fairseq,realformer+compiled@bf16,realformer+compiled,fairseq@fp16/cudnn-off,realformer@bf16)
fi
"$py" -c "import torch, fairseq; print('torch', torch.__version__, 'fairseq', fairseq.__version__)"
left() { echo $((total - (SECONDS - start))); }

# step 1 runs whatever the budget says for its first two (the question), then what fits; the hard
# limit (timeout) 30 s beyond the budget only stops an expectation gone badly wrong
budget=$(($(left) - 10))
say "1/2 train_update.py ${first[*]}, budget $budget s"
timeout $((budget + 30)) "$py" "$root/benchmarks/train_update.py" "${first[@]}" --budget "$budget" --work "$work" \
  --json "$out/gpu-train-update-fp16.json" || say "step 1 stopped (exit $?): its JSON holds the runs it finished"

# step 2 expects a compile as long as the longest step 1 saw (cold again: another precision)
guess=$("$py" - "$out/gpu-train-update-fp16.json" <<'EOF' 2>/dev/null || echo 120
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
print(round(max([r.get("compile_s", 0) for r in runs] + [0]) or 120))
EOF
)
budget=$(($(left) - 10))
if [ "$budget" -gt 30 ]; then
  say "2/2 train_update.py ${second[*]}, budget $budget s (compiling expected ${guess} s)"
  timeout $((budget + 30)) "$py" "$root/benchmarks/train_update.py" "${second[@]}" --budget "$budget" --always 1 \
    --compile-guess "$guess" --work "$work" --json "$out/gpu-train-update-18L.json" ||
    say "step 2 stopped (exit $?): its JSON holds the runs it finished"
else
  say "2/2 skipped: $budget s left"
fi

say "done in $((SECONDS - start)) s: $out"
for json in "$out/gpu-train-update-fp16.json" "$out/gpu-train-update-18L.json"; do
  [ -f "$json" ] && "$py" "$root/benchmarks/train_update.py" --summary "$json" || true
done
