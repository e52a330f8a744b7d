#!/usr/bin/env bash
# Session 8, call I (nvidia-h200, carry [".deps"]): the m64 kernel at two CTAs per SM with a
# 4-stage ring (two chunks loaded ahead at N = 160; MOE_EP_M64_CTAS=2) against the three-CTA
# default. Build; GpuLayer cases on tile 160 with the knob; A/B at 1024-4096 tokens.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/round.log 2>&1; tail -1 $OUT/round.log
MOE_EP_M64_CTAS=2 timeout 150 build-gpu/tests/moe_ep_gpu_tests \
  --gtest_filter='GpuLayer.Dsv3AllRecipes:GpuLayer.Qwen3Capacity4096:GpuLayer.EdgeRouting:GpuLayer.SmallForSanitizer' \
  > $OUT/gpu_tests_2cta.log 2>&1
echo "2 CTAs GpuLayer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/gpu_tests_2cta.log | tr '\n' ' ')"
for k in "" 2 "" 2; do
  echo "# MOE_EP_M64_CTAS=$k"
  MOE_EP_M64_CTAS=$k timeout 100 build-gpu/bench/bench_layer --shape dsv3 \
    --recipes nvfp4,mxfp4_mxfp8 --routing both --tokens 1024,2048,4096 --iters 20 2>&1 |
    grep -E "uniform|zipf|rror"
done > $OUT/m64_ctas_ab.log 2>&1
cat $OUT/m64_ctas_ab.log
