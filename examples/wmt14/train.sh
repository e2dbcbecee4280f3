#!/usr/bin/env bash
# Train one model of the RealFormer paper's Table 7 (WMT'14 En-De / En-Fr) with the paper's NMT
# schedule: Adam (0.9, 0.98), peak lr 5e-4 (En-De) / 1.2e-3 (En-Fr), linear warmup then linear
# decay to 0 at the end of epoch 50, label smoothing 0.1, ~32k tokens per update, one checkpoint
# per epoch. Arguments it does not know go to fairseq-train, after its own flags (so they win).
# Run with --help for the options; examples/wmt14/README.md has the command for every row.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
USER_DIR="$(cd "$HERE/../.." && pwd)/fairseq_realformer"
PYTHON="${PYTHON:-python3}"

VARIANT=realformer      # a name of fairseq_realformer/variants.py: realformer | admin | post-ln | pre-ln | ...
DEPTH=6                 # N (N encoder and N decoder layers) or E-D, e.g. 60-12
LANG_PAIR=en-de         # en-de | en-fr
DATA=""                 # default: data-bin/wmt14_en_de or data-bin/wmt14_en_fr
SAVE_DIR=""             # default: checkpoints/wmt14_<lang>_<variant>_<depth>
GPUS=auto               # GPUs per node; 0: CPU processes with gloo
CPU_PROCS=2             # processes per node when there is no GPU
NNODES=1
NODE_RANK=0
MASTER_ADDR=127.0.0.1
MASTER_PORT=29500
MAX_TOKENS=4096
TOKENS_PER_UPDATE=32768
UPDATE_FREQ=""          # default: ceil(TOKENS_PER_UPDATE / (world size * MAX_TOKENS))
EPOCHS=50
WARMUP=8000
LR=""                   # default: 5e-4 (en-de), 1.2e-3 (en-fr)
TOTAL_NUM_UPDATE=""     # default: EPOCHS * updates per epoch (updates_per_epoch.py)
KEEP_LAST_EPOCHS=25     # the paper averages the last 25 epoch checkpoints
PRECISION=""            # fp16 | bf16 | fp32; default: fp16 on GPUs, fp32 on CPU
SEED=1
DRY_RUN=0
EXTRA=()

usage() {
    cat <<'EOF'
Usage: train.sh [options] [fairseq-train arguments...]

  --variant V            realformer | admin | post-ln | pre-ln | deepnorm | realformer-sum |
                         rezero | rezero-realformer | t-fixup | t-fixup-realformer | admin-radam
                         (fairseq_realformer/variants.py)               (default: realformer)
  --depth D              6 | 12 | 18 | 60-12: encoder-decoder layers    (default: 6)
  --lang L               en-de | en-fr                                  (default: en-de)
  --data DIR             binarised data        (default: data-bin/wmt14_en_de | _en_fr)
  --save-dir DIR         checkpoints, train.log, tensorboard/
                                  (default: checkpoints/wmt14_<lang>_<variant>_<depth>)
  --gpus N               GPUs per node; 0 trains on CPU         (default: all visible)
  --cpu-procs N          CPU processes per node (gloo) when --gpus 0    (default: 2)
  --nnodes N --node-rank R --master-addr HOST --master-port PORT
                         multi-node training with torchrun, one call per node
  --max-tokens N         tokens per batch per process                   (default: 4096)
  --tokens-per-update N  --update-freq = ceil(N / (processes * max-tokens)) (default: 32768)
  --update-freq N        instead of computing it
  --epochs N             (default: 50)
  --warmup N             linear warmup updates                          (default: 8000)
  --lr LR                peak learning rate        (default: 5e-4 en-de, 1.2e-3 en-fr)
  --total-num-update N   where the linear decay reaches 0 (default: epochs x updates per
                         epoch, counted from the data by updates_per_epoch.py)
  --keep-last-epochs N   epoch checkpoints kept                         (default: 25)
  --precision P          fp16 | bf16 | fp32                (default: fp16 on GPUs, fp32 on CPU)
  --seed N               (default: 1)
  --dry-run              print the command, run nothing
  --                     everything after it goes to fairseq-train
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --variant) VARIANT="$2"; shift 2 ;;
        --depth) DEPTH="$2"; shift 2 ;;
        --lang) LANG_PAIR="$2"; shift 2 ;;
        --data) DATA="$2"; shift 2 ;;
        --save-dir) SAVE_DIR="$2"; shift 2 ;;
        --gpus) GPUS="$2"; shift 2 ;;
        --cpu-procs) CPU_PROCS="$2"; shift 2 ;;
        --nnodes) NNODES="$2"; shift 2 ;;
        --node-rank) NODE_RANK="$2"; shift 2 ;;
        --master-addr) MASTER_ADDR="$2"; shift 2 ;;
        --master-port) MASTER_PORT="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        --tokens-per-update) TOKENS_PER_UPDATE="$2"; shift 2 ;;
        --update-freq) UPDATE_FREQ="$2"; shift 2 ;;
        --epochs) EPOCHS="$2"; shift 2 ;;
        --warmup) WARMUP="$2"; shift 2 ;;
        --lr) LR="$2"; shift 2 ;;
        --total-num-update) TOTAL_NUM_UPDATE="$2"; shift 2 ;;
        --keep-last-epochs) KEEP_LAST_EPOCHS="$2"; shift 2 ;;
        --precision) PRECISION="$2"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA+=("$@"); break ;;
        *) EXTRA+=("$1"); shift ;;
    esac
done

die() { printf 'train.sh: error: %s\n' "$*" >&2; exit 2; }

# --- the model: one row of Table 7 (the variants' flags: fairseq_realformer/variants.py) ---
VARIANT_FLAGS="$("$PYTHON" "$USER_DIR/variants.py" "$VARIANT" 2>&1)" || die "${VARIANT_FLAGS#*error: }"
mapfile -t VARIANT_FLAGS <<< "$VARIANT_FLAGS"
MODEL=(--arch realformer_wmt_en_de "${VARIANT_FLAGS[@]}")
if [[ "$DEPTH" =~ ^([0-9]+)-([0-9]+)$ ]]; then
    ENC_LAYERS="${BASH_REMATCH[1]}"; DEC_LAYERS="${BASH_REMATCH[2]}"
elif [[ "$DEPTH" =~ ^[0-9]+$ ]]; then
    ENC_LAYERS="$DEPTH"; DEC_LAYERS="$DEPTH"
else
    die "--depth must be N or ENC-DEC, e.g. 6 or 60-12 (got '$DEPTH')"
fi
case "$LANG_PAIR" in
    en-de) DEFAULT_LR=5e-4 ;;
    en-fr) DEFAULT_LR=1.2e-3 ;;
    *) die "--lang must be en-de or en-fr (got '$LANG_PAIR')" ;;
esac
SRC="${LANG_PAIR%-*}"
TGT="${LANG_PAIR#*-}"
LR="${LR:-$DEFAULT_LR}"
DATA="${DATA:-data-bin/wmt14_${SRC}_${TGT}}"
SAVE_DIR="${SAVE_DIR:-checkpoints/wmt14_${SRC}_${TGT}_${VARIANT}_${DEPTH}}"

# --- processes: GPUs, or CPU processes with gloo so the distributed path runs anywhere ---
if [ "$GPUS" = auto ]; then
    GPUS="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')"
fi
if [ "$GPUS" -gt 0 ]; then
    PROCS="$GPUS"
    DEVICE=()
    PRECISION="${PRECISION:-fp16}"
else
    PROCS="$CPU_PROCS"
    # gloo, and legacy_ddp: the default pytorch_ddp hands CUDA device ids to DDP and fails on CPU
    DEVICE=(--cpu --distributed-backend gloo --ddp-backend legacy_ddp)
    PRECISION="${PRECISION:-fp32}"
fi
WORLD_SIZE=$((NNODES * PROCS))
# --max-tokens counts the longer side of each sentence pair, padding included, per process
UPDATE_FREQ="${UPDATE_FREQ:-$(( (TOKENS_PER_UPDATE + WORLD_SIZE * MAX_TOKENS - 1) / (WORLD_SIZE * MAX_TOKENS) ))}"
case "$PRECISION" in
    fp16) DEVICE+=(--fp16) ;;
    # the plugin's bfloat16 mixed precision (float32 weights, no loss scaler), on GPUs or CPUs
    bf16) DEVICE+=(--bf16) ;;
    fp32) ;;
    *) die "--precision must be fp16, bf16 or fp32 (got '$PRECISION')" ;;
esac
# Always explicit: fairseq's default world size is the number of visible GPUs, and with one
# process per node it would otherwise skip distributed set-up altogether.
DISTRIBUTED=(--distributed-world-size "$WORLD_SIZE")
if [ "$WORLD_SIZE" -gt 1 ]; then
    # torchrun starts the processes; each learns its rank from torchrun (see RANK_WRAPPER)
    DISTRIBUTED+=(--distributed-init-method env:// --distributed-no-spawn)
fi

ARGS=(
    "$DATA" --user-dir "$USER_DIR" --task translation --source-lang "$SRC" --target-lang "$TGT"
    --encoder-layers "$ENC_LAYERS" --decoder-layers "$DEC_LAYERS" --share-all-embeddings
    --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 0.0
    --lr "$LR" --lr-scheduler polynomial_decay --power 1 --end-learning-rate 0
    --warmup-updates "$WARMUP"
    "${MODEL[@]}"  # after the training flags: a variant may set its own (admin-radam)
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-epoch "$EPOCHS"
    --save-dir "$SAVE_DIR" --save-interval 1 --keep-last-epochs "$KEEP_LAST_EPOCHS"
    --tensorboard-logdir "$SAVE_DIR/tensorboard" --log-file "$SAVE_DIR/train.log"
    --log-format simple --log-interval 100 --seed "$SEED"
    "${DEVICE[@]}" "${DISTRIBUTED[@]}"
)

# Linear decay must reach 0 when the last epoch ends: count the updates of one epoch by batching
# the data exactly as fairseq-train will with these arguments (pass-through ones included).
if [ -z "$TOTAL_NUM_UPDATE" ]; then
    if [ "$DRY_RUN" = 1 ] && [ ! -d "$DATA" ]; then
        TOTAL_NUM_UPDATE="<$EPOCHS x updates per epoch>"
    else
        echo "counting the updates per epoch of $DATA..."
        PER_EPOCH="$("$PYTHON" "$HERE/updates_per_epoch.py" "${ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"} \
                     --total-num-update 1 | tail -n 1)"
        TOTAL_NUM_UPDATE=$((EPOCHS * PER_EPOCH))
        echo "$PER_EPOCH updates per epoch x $EPOCHS epochs: --total-num-update $TOTAL_NUM_UPDATE"
    fi
fi
# pass-through arguments last: fairseq takes the last value of a flag given twice
ARGS+=(--total-num-update "$TOTAL_NUM_UPDATE" ${EXTRA[@]+"${EXTRA[@]}"})

if [ "$WORLD_SIZE" -gt 1 ]; then
    # One fairseq-train per process, told its rank: fairseq reads ranks from torchrun's
    # environment only on GPUs, and without them every process would train alone.
    RANK_WRAPPER='exec fairseq-train "$@" --distributed-rank "$RANK" --device-id "$LOCAL_RANK"'
    if [ "$NNODES" -gt 1 ]; then
        LAUNCH=(torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK"
                --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
    else
        LAUNCH=(torchrun --standalone --nnodes 1)  # a free local port
    fi
    CMD=("${LAUNCH[@]}" --nproc-per-node "$PROCS" --no-python
         bash -c "$RANK_WRAPPER" fairseq-train "${ARGS[@]}")
else
    CMD=(fairseq-train "${ARGS[@]}")
fi

echo "$VARIANT ${ENC_LAYERS}L-${DEC_LAYERS}L $LANG_PAIR: $WORLD_SIZE process(es) ($NNODES node(s) x $PROCS)," \
     "update-freq $UPDATE_FREQ x max-tokens $MAX_TOKENS x $WORLD_SIZE = $((UPDATE_FREQ * MAX_TOKENS * WORLD_SIZE)) tokens per update"
printf '%q ' "${CMD[@]}"
echo
if [ "$DRY_RUN" = 1 ]; then exit 0; fi
# fairseq-train opens --log-file before it makes the save dir: make it here, and take back what
# this made if fairseq-train fails before writing into it (a refused flag leaves no empty folder)
NEW_DIR=""
if [ ! -e "$SAVE_DIR" ]; then
    NEW_DIR=$SAVE_DIR
    while [ ! -e "$(dirname "$NEW_DIR")" ]; do NEW_DIR=$(dirname "$NEW_DIR"); done
fi
mkdir -p "$SAVE_DIR"
"${CMD[@]}" || {
    status=$?
    if [ -n "$NEW_DIR" ]; then find "$NEW_DIR" -depth -type d -empty -delete 2>/dev/null || true; fi
    exit "$status"
}
