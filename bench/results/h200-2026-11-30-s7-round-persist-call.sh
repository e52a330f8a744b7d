set -u
OUT=$OUT ./scripts/gpu_round.sh build test > $OUT/round.log 2>&1; tail -5 $OUT/round.log
grep -E "OK|FAILED|Failure|Expected|Which is|differs" $OUT/gpu_tests.log | grep -v "^\[       OK" | head -20
grep -E "DecodePersist" $OUT/gpu_tests.log
export NCCL_NVLS_ENABLE=0
echo "== GpuLayer with MOE_EP_DECODE_PERSIST=1"
MOE_EP_DECODE_PERSIST=1 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.*' > $OUT/gpu_tests_persist.log 2>&1; grep -E "PASSED|FAILED|tests ran" $OUT/gpu_tests_persist.log | head
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  MOE_EP_DECODE_PERSIST=1 $SAN --tool $tool --error-exitcode 1 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.SmallForSanitizer' > $OUT/san_$tool.log 2>&1
  echo "$tool persist: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$tool.log | tail -1)"
done
echo "== bench A/B"
for round in 1 2; do for p in 0 1; do
  echo "# round $round MOE_EP_DECODE_PERSIST=$p"
  MOE_EP_DECODE_PERSIST=$p build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,8,32,128,512 --iters 20 2>&1 | grep uniform
done; done > $OUT/persist_ab.log
cat $OUT/persist_ab.log
