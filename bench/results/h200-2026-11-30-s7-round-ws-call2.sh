set -u
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/round.log 2>&1; tail -2 $OUT/round.log
export NCCL_NVLS_ENABLE=0
T=build-gpu/tests/moe_ep_gpu_tests
MOE_EP_WGMMA_V=4 timeout 300 $T --gtest_filter='GpuLayer.Dsv3AllRecipes:GpuLayer.GraphReplayWithNumTokens:GpuLayer.SmallForSanitizer:GpuLayer.Qwen3Capacity4096' > $OUT/gpu_tests_v4.log 2>&1; echo rc=$?
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" $OUT/gpu_tests_v4.log | head
for v in 0 4; do
  echo "# MOE_EP_WGMMA_V=$v"
  MOE_EP_WGMMA_V=$v timeout 120 build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_bf16 --routing uniform --tokens 2048,4096 --iters 20 2>&1 | grep -E "uniform|rror"
done > $OUT/ws_ab.log 2>&1
cat $OUT/ws_ab.log
