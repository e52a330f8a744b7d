#!/usr/bin/env bash
# Session 9, call G (nvidia-h200-x2, carry [".deps"]; ab_base/ = main's tree, untracked, for the
# A/B): the m64 kernel with branch-free stage loads (branch s9-m64-lean, 205 -> 167 instructions
# per K-chunk) against main, both built here. GPU tests, memcheck / racecheck, A/B at 512-4096
# tokens, alternating the two builds.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
(cmake -S ab_base -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON \
   -DNCCL_ROOT=$NCCL_DIR -DGTEST_ROOT="$PWD/.deps/gtest" -DCUTLASS_DIR="$PWD/.deps/cutlass/include" > $W/base_cfg.log 2>&1 &&
 cmake --build build-base -j 12 --target bench_layer > $W/base_build.log 2>&1; echo "base build rc=$?") &
BASE=$!
OUT=$W ./scripts/gpu_round.sh build test sanitize > $W/round.log 2>&1
grep -E "build ok|memcheck|racecheck|PASSED|FAILED|tests ran|Failure|error" $W/round.log | head -20
wait $BASE
export LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}
for rep in 1 2; do
  for b in build-base build-gpu; do
    echo "# $b"
    timeout 100 $b/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing both \
      --tokens 1024,2048,4096 --iters 20 2>&1 | grep -E "uniform|zipf|rror"
    MOE_EP_TILE_N=160 timeout 60 $b/bench/bench_layer --shape dsv3 --recipes nvfp4 \
      --routing uniform --tokens 512,640 --iters 20 2>&1 | grep -E "uniform|rror"
  done
done > $W/lean_ab.log 2>&1
cat $W/lean_ab.log
(cd $W && tar -czf $OUT/s9g.tar.gz --exclude build.log --exclude base_build.log .)
