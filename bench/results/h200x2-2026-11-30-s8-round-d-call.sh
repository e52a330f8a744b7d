#!/usr/bin/env bash
# Session 8, call D (nvidia-h200-x2, carry [".deps"]): the m64 three-CTA default at tiles of 160
# on two GPUs. Build; GPU tests; multi-GPU suite; per-replay trace with SM clocks at 4096 tokens
# (is the spread of the replays an input set or the clock?); EP = 2 benchmark and its EP = 1
# reference (E = 128).
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build test multigpu > $W/round.log 2>&1
grep -E "build ok|PASSED|FAILED|tests ran|Failure|error" $W/round.log | head -20
export NCCL_NVLS_ENABLE=0
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
export LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}
B=build-gpu/bench/bench_layer
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -i 0 -lms 20 > $W/clocks.csv 2>&1 &
SMI=$!
MOE_EP_BENCH_TRACE=1 timeout 120 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform \
  --tokens 4096 --iters 20 > $W/trace.log 2>&1
kill $SMI
grep -E "uniform|replays" $W/trace.log
awk -F', ' 'NR>1 {print $2, $3}' $W/clocks.csv | sort | uniq -c | sort -rn | head -8
timeout 200 $B --ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,128,512,2048,4096 \
  --iters 20 > $W/ep2.log 2>&1
grep -vE "^\[moe-ep\]" $W/ep2.log | tail -12
timeout 100 $B --shape dsv3 --experts 128 --recipes nvfp4 --routing uniform \
  --tokens 1,128,512,2048,4096 --iters 20 2>&1 | grep uniform
(cd $W && tar -czf $OUT/s8d.tar.gz .)
