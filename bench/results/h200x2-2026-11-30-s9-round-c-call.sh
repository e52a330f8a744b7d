#!/usr/bin/env bash
# Session 9, call C (nvidia-h200-x2, carry [".deps"]): the 2x2 m64 shape as the default. Build;
# the GPU tests (with GpuLayer.M64ShapesSameBits: every shape's bits equal); Nsight Compute with
# per-instruction stall samples of the m64 kernel at 4096 tokens; the tile 16 / 160 threshold
# again (448-704 tokens), since the m64 kernel got faster.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build test > $W/round.log 2>&1
grep -E "build ok|PASSED|FAILED|tests ran|Failure|error" $W/round.log | head -20
B=build-gpu/bench/bench_layer
PROFILE_SOURCE=1 PROFILE_CASES="wgmma3 4096" OUT=$W ./scripts/gpu_round.sh profile \
  > $W/profile.log 2>&1
tail -14 $W/profile.log
for tn in 16 "" 16 ""; do
  echo "# MOE_EP_TILE_N=$tn"
  MOE_EP_TILE_N=$tn timeout 100 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing both \
    --tokens 448,512,576,640,704 --iters 20 2>&1 | grep -E "uniform|zipf|rror"
done > $W/threshold.log 2>&1
cat $W/threshold.log
(cd $W && tar -czf $OUT/s9c.tar.gz --exclude build.log .)
