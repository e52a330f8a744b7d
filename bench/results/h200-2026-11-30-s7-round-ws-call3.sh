set -u
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/round.log 2>&1; tail -1 $OUT/round.log
T=build-gpu/tests/moe_ep_gpu_tests
MOE_EP_WGMMA_V=4 timeout 200 $T --gtest_filter='GpuLayer.*' > $OUT/gpu_tests_v4.log 2>&1; echo "v4 GpuLayer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/gpu_tests_v4.log)"
grep -E "FAILED|Failure" $OUT/gpu_tests_v4.log | head -5
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  MOE_EP_WGMMA_V=4 timeout 100 $SAN --tool $tool --error-exitcode 1 $T --gtest_filter='GpuLayer.SmallForSanitizer' > $OUT/san_$tool.log 2>&1
  echo "$tool v4: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$tool.log | tail -1)"
done
for v in 0 4; do echo "# MOE_EP_WGMMA_V=$v"; MOE_EP_WGMMA_V=$v timeout 100 build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 2048,4096 --iters 20 2>&1 | grep -E "uniform|rror"; done > $OUT/ws_ab.log 2>&1
cat $OUT/ws_ab.log
