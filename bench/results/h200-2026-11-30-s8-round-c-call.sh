#!/usr/bin/env bash
# Session 8, call C (nvidia-h200, carry [".deps"]): the m64 kernel at three CTAs per SM with
# tiles of 160 as the default above 24 rows per expert. Build; all GPU tests; GpuLayer with 2
# wgmma steps in flight; memcheck / racecheck; A/B at 1024-4096 tokens (uniform and Zipf):
# default (4 in flight), MOE_EP_M64_INFLIGHT=2, and MOE_EP_WGMMA_V=2 (tiles of 128 on v2).
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build test sanitize > $W/round.log 2>&1; grep -vE "^(name|NVIDIA)" $W/round.log | tail -12
T=build-gpu/tests/moe_ep_gpu_tests
MOE_EP_M64_INFLIGHT=2 timeout 200 $T --gtest_filter='GpuLayer.*' > $W/gpu_tests_if2.log 2>&1
echo "in-flight 2 GpuLayer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/gpu_tests_if2.log)"
for run in 1 2; do
  for k in "" "MOE_EP_M64_INFLIGHT=2" "MOE_EP_WGMMA_V=2"; do
    echo "# $k"
    env $k timeout 150 build-gpu/bench/bench_layer --shape dsv3 \
      --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing both --tokens 1024,2048,4096 --iters 20 2>&1 |
      grep -E "uniform|zipf|rror"
  done
done > $W/m64_ab.log 2>&1
cat $W/m64_ab.log
(cd $W && tar -czf $OUT/s8c.tar.gz .)
