#!/usr/bin/env bash
# Session 9, call E (nvidia-h200-x2, carry [".deps"]): the m64 kernel's ring on per-slot
# mbarriers (shapes 2x2m, 4x1m: every thread publishes its copies one chunk after issuing them,
# every warpgroup releases a slot after retiring its wgmmas) against the CTA barrier per chunk
# (2x2, the default). GPU tests (M64ShapesSameBits covers both), memcheck and racecheck of the
# small case on 2x2m, A/B at 1024-4096 tokens.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build test > $W/round.log 2>&1
grep -E "build ok|PASSED|FAILED|tests ran|Failure|error" $W/round.log | head -20
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  MOE_EP_M64=2x2m timeout 200 "$SAN" --tool $tool --error-exitcode 1 build-gpu/tests/moe_ep_gpu_tests \
    --gtest_filter='GpuLayer.SmallForSanitizer' > $W/sanitize_2x2m_$tool.log 2>&1
  echo "2x2m $tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $W/sanitize_2x2m_$tool.log | tail -1)"
done
B=build-gpu/bench/bench_layer
for rep in 1 2; do
  for v in 2x2 2x2m 4x1m; do
    echo "# MOE_EP_M64=$v"
    MOE_EP_M64=$v timeout 100 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing both \
      --tokens 1024,2048,4096 --iters 20 2>&1 | grep -E "uniform|zipf|rror"
  done
done > $W/mbar_ab.log 2>&1
cat $W/mbar_ab.log
(cd $W && tar -czf $OUT/s9e.tar.gz --exclude build.log .)
