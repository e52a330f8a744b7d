#!/usr/bin/env bash
# Session 3 last H200x2 round: the automatic tile-256 choice (m64 wgmma kernel) on main.
OUT=$OUT timeout 100 ./scripts/gpu_round.sh build test > $OUT/round.log 2>&1; tail -4 $OUT/round.log
B=build-gpu; export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib:${LD_LIBRARY_PATH:-}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
MOE_EP_WGMMA_V=3 timeout 25 $SAN --tool memcheck --error-exitcode 1 $B/tests/moe_ep_gpu_tests --gtest_filter=GpuLayer.SmallForSanitizer > $OUT/memcheck_v3.log 2>&1; grep "ERROR SUMMARY" $OUT/memcheck_v3.log
MOE_EP_WGMMA_V=3 timeout 60 $B/tests/multigpu/moe_ep_multigpu_tests --gtest_filter='EpLayer*' > $OUT/multigpu_v3.log 2>&1; grep -E "PASSED|FAILED" $OUT/multigpu_v3.log | head -5
timeout 25 $B/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 2048,4096 --json $OUT/ep1.json > $OUT/ep1.log 2>&1; grep -E "^dsv3" $OUT/ep1.log
timeout 15 $B/bench/bench_layer --shape dsv3 --experts 128 --recipes nvfp4 --routing uniform --tokens 4096 > $OUT/e128.log 2>&1; grep -E "^dsv3" $OUT/e128.log
timeout 25 $B/bench/bench_layer --ep 2 --shape dsv3 --recipes nvfp4 --tokens 4096 --json $OUT/ep2.json > $OUT/ep2.log 2>&1; grep -E "^dsv3|stages" $OUT/ep2.log
