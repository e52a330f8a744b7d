#!/usr/bin/env bash
# Session 9, call A (nvidia-h200-x2, carry [".deps"]): the m64 kernel with G warpgroups per CTA
# sharing each B stage (MOE_EP_M64=GxB: G warpgroups, B CTAs per SM). Build; GPU tests on the
# default shape (1x3); GpuLayer cases on tile 160 for each other shape; A/B at 1024-4096 tokens.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/round.log 2>&1; tail -1 $OUT/round.log
timeout 200 build-gpu/tests/moe_ep_gpu_tests > $OUT/gpu_tests.log 2>&1
echo "1x3 all GPU tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/gpu_tests.log | tr '\n' ' ')"
for v in 2x2 2x1 3x1 4x1; do
  MOE_EP_M64=$v timeout 150 build-gpu/tests/moe_ep_gpu_tests \
    --gtest_filter='GpuLayer.Dsv3AllRecipes:GpuLayer.Qwen3Capacity4096:GpuLayer.EdgeRouting' \
    > $OUT/gpu_tests_$v.log 2>&1
  echo "$v GpuLayer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/gpu_tests_$v.log | tr '\n' ' ')"
done
for rep in 1 2; do
  for v in 1x3 2x2 2x1 3x1 4x1; do
    echo "# MOE_EP_M64=$v"
    MOE_EP_M64=$v timeout 100 build-gpu/bench/bench_layer --shape dsv3 \
      --recipes nvfp4,mxfp4_mxfp8 --tokens 1024,2048,4096 --iters 20 2>&1 |
      grep -E "uniform|zipf|rror"
  done
done > $OUT/m64_shape_ab.log 2>&1
cat $OUT/m64_shape_ab.log
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv >> $OUT/m64_shape_ab.log
