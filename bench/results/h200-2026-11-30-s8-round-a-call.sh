#!/usr/bin/env bash
# Session 8, call A (nvidia-h200, carry [".deps"]): build; the GPU tests on main's kernels (the
# review's m64_epilogue change included) and again with the L2 prefetch knob on; memcheck with
# it; then the L2 prefetch A/B at decode sizes (MOE_EP_L2_PREFETCH="fc1 chunks, fc2 chunks,
# early").
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
OUT=$OUT ./scripts/gpu_round.sh build test > $OUT/round.log 2>&1; tail -4 $OUT/round.log
T=build-gpu/tests/moe_ep_gpu_tests
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
MOE_EP_L2_PREFETCH=28,16,1 timeout 200 $T --gtest_filter='GpuLayer.*' > $OUT/gpu_tests_pf.log 2>&1
echo "prefetch 28,16,1 GpuLayer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/gpu_tests_pf.log)"
MOE_EP_L2_PREFETCH=112,32,0 timeout 100 $SAN --tool memcheck --error-exitcode 1 $T \
  --gtest_filter='GpuLayer.SmallForSanitizer' > $OUT/san_pf_memcheck.log 2>&1
echo "prefetch memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san_pf_memcheck.log | tail -1)"
for p in "" 28,0,0 56,0,0 0,16,0 0,16,1 0,32,1 28,16,0 28,16,1 28,32,1 ""; do
  echo "# MOE_EP_L2_PREFETCH=$p"
  MOE_EP_L2_PREFETCH=$p timeout 100 build-gpu/bench/bench_layer --shape dsv3 \
    --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,8 --iters 20 2>&1 |
    grep -E "uniform|rror"
done > $OUT/l2pf_ab.log 2>&1
cat $OUT/l2pf_ab.log
