set -u
OUT=$OUT ./scripts/gpu_round.sh build test sanitize multigpu > $OUT/round.log 2>&1; grep -vE "^ +[0-9]+ |DSV3|blocks" $OUT/round.log | tail -25
export NCCL_NVLS_ENABLE=0
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])"); export LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}
T=build-gpu/tests/moe_ep_gpu_tests
MOE_EP_WGMMA_V=4 timeout 300 $T --gtest_filter='GpuLayer.*' > $OUT/gpu_tests_v4.log 2>&1; echo "v4 GpuLayer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/gpu_tests_v4.log)"
{ echo "# default"; build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,8,32,128,512,2048,4096 --iters 20 2>&1 | grep -E "uniform|rror"
  echo "# MOE_EP_WGMMA_V=4"; MOE_EP_WGMMA_V=4 build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 2048,4096 --iters 20 2>&1 | grep -E "uniform|rror"
  echo "# EP=2"; build-gpu/bench/bench_layer --ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,128,4096 --iters 20 2>&1 | grep -E "uniform|rror|rank"; } > $OUT/bench.log 2>&1
cat $OUT/bench.log
