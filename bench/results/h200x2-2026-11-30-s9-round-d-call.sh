#!/usr/bin/env bash
# Session 9, call D (nvidia-h200-x2, carry [".deps"]): the 2x2 default under compute-sanitizer
# and in the multi-GPU suite; the tile threshold with tile 160 forced (call C compared tile 16
# with the default, which is tile 16 below 20 rows); a trace of every replay at 640 tokens (call
# C: 4.8 ms in graph replays against 3.8 ms of eager stages, with tile 16); EP = 2 with 2x2.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build sanitize multigpu > $W/round.log 2>&1
grep -E "build ok|memcheck|racecheck|PASSED|FAILED|tests ran|Failure|error" $W/round.log | head -20
export NCCL_NVLS_ENABLE=0
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
export LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}
B=build-gpu/bench/bench_layer
for tn in 160 16 160 16; do
  echo "# MOE_EP_TILE_N=$tn"
  MOE_EP_TILE_N=$tn timeout 100 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 \
    --routing both --tokens 384,448,512,576,640 --iters 20 2>&1 | grep -E "uniform|zipf|rror"
done > $W/threshold160.log 2>&1
cat $W/threshold160.log | grep -E "#|uniform"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -i 0 -lms 20 > $W/clocks640.csv 2>&1 &
SMI=$!
for tn in 16 160; do
  echo "# MOE_EP_TILE_N=$tn"
  MOE_EP_TILE_N=$tn MOE_EP_BENCH_TRACE=1 timeout 100 $B --shape dsv3 --recipes nvfp4 \
    --routing uniform --tokens 576,640,704 --iters 20 2>&1 | grep -E "uniform|replays|rror"
done > $W/trace640.log 2>&1
kill $SMI
cat $W/trace640.log
timeout 300 $B --ep 2 --shape dsv3 --recipes nvfp4 --routing uniform \
  --tokens 1,128,512,2048,4096 --iters 20 > $W/ep2.log 2>&1
grep -vE "^\[moe-ep\]" $W/ep2.log | tail -8
timeout 100 $B --shape dsv3 --experts 128 --recipes nvfp4 --routing uniform \
  --tokens 1,128,512,2048,4096 --iters 20 2>&1 | grep uniform | tee $W/ep1_e128.log
(cd $W && tar -czf $OUT/s9d.tar.gz --exclude build.log .)
