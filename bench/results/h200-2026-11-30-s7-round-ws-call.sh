set -u
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/round.log 2>&1; tail -3 $OUT/round.log
export NCCL_NVLS_ENABLE=0
T=build-gpu/tests/moe_ep_gpu_tests
echo "== GpuLayer with MOE_EP_WGMMA_V=4"
MOE_EP_WGMMA_V=4 timeout 300 $T --gtest_filter='GpuLayer.*' > $OUT/gpu_tests_v4.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|rel_l2|Expected|Which is" $OUT/gpu_tests_v4.log | head -30
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  MOE_EP_WGMMA_V=4 timeout 200 $SAN --tool $tool --error-exitcode 1 $T --gtest_filter='GpuLayer.SmallForSanitizer' > $OUT/san_v4_$tool.log 2>&1
  echo "$tool v4: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_v4_$tool.log | tail -1)"
done
echo "== bench"
for round in 1 2; do for v in 0 4; do
  echo "# round $round MOE_EP_WGMMA_V=$v"
  MOE_EP_WGMMA_V=$v timeout 120 build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing uniform --tokens 1024,2048,4096 --iters 20 2>&1 | grep -E "uniform|rror"
done; done > $OUT/ws_ab.log 2>&1
cat $OUT/ws_ab.log
