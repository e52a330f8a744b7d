#!/usr/bin/env bash
# Session 8, call F (nvidia-h200-x2, carry [".deps"]): tile 160 above a mean of 20 rows and the
# EP owner's fc1 ring for 3 CTAs per SM at a few tokens. Build; GPU tests; multi-GPU suite;
# EP = 2 at 1 / 2 / 8 / 128 tokens per rank; tile 16 vs 160 around the new threshold.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build test multigpu > $W/round.log 2>&1
grep -E "build ok|PASSED|FAILED|tests ran|Failure|error" $W/round.log | head -20
export NCCL_NVLS_ENABLE=0
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
export LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}
B=build-gpu/bench/bench_layer
for run in 1 2; do
  timeout 150 $B --ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,2,8,128 \
    --iters 20 2>&1 | grep -vE "^\[moe-ep\]|^combine|^shape"
done > $W/ep2.log 2>&1
cat $W/ep2.log
for t in "" 16 160; do
  echo "# MOE_EP_TILE_N=$t"
  MOE_EP_TILE_N=$t timeout 100 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing both \
    --tokens 576,640,704 --iters 20 2>&1 | grep -E "uniform|zipf"
done > $W/tile_ab.log 2>&1
cat $W/tile_ab.log
(cd $W && tar -czf $OUT/s8f.tar.gz .)
