#!/usr/bin/env bash
# Session 9, call B (nvidia-h200-x2, carry [".deps"]): the m64 kernel's shapes (MOE_EP_M64 =
# "GxB" or "fc1,fc2") at 4096 tokens with every replay traced and the SM clock / power logged
# (call A's replays at 4096 tokens were bimodal for 1x3 and 2x2); 1024-2048 tokens for the
# mixed shapes; Nsight Compute with per-instruction stall samples of 2x2 at 4096 tokens.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build > $W/round.log 2>&1; tail -1 $W/round.log
B=build-gpu/bench/bench_layer
MOE_EP_M64=4x1,2x2 timeout 150 build-gpu/tests/moe_ep_gpu_tests \
  --gtest_filter='GpuLayer.Dsv3AllRecipes:GpuLayer.Qwen3Capacity4096:GpuLayer.EdgeRouting' \
  > $W/gpu_tests_4x1_2x2.log 2>&1
echo "4x1,2x2 GpuLayer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/gpu_tests_4x1_2x2.log | tr '\n' ' ')"
for v in 1x3 2x2 4x1 4x1,2x2 2x2,4x1 2x2 4x1 1x3; do
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -i 0 -lms 20 > $W/clocks_$v.csv 2>&1 &
  SMI=$!
  echo "# MOE_EP_M64=$v"
  MOE_EP_M64=$v MOE_EP_BENCH_TRACE=1 timeout 100 $B --shape dsv3 --recipes nvfp4 \
    --routing uniform --tokens 4096 --iters 20 2>&1 | grep -E "uniform|replay|rror"
  kill $SMI; sleep 0.2
  awk -F', ' 'NR>1 {c[$2]++; p+=$3; n++} END {for (k in c) printf "%s:%d ", k, c[k]; printf " mean power %.0f W\n", p/n}' $W/clocks_$v.csv
done > $W/trace4096.log 2>&1
grep -vE "^replay" $W/trace4096.log
for v in 4x1,2x2 2x2,4x1 2x2 4x1; do
  echo "# MOE_EP_M64=$v"
  MOE_EP_M64=$v timeout 100 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing both \
    --tokens 1024,2048 --iters 20 2>&1 | grep -E "uniform|zipf|rror"
done > $W/mixed_ab.log 2>&1
cat $W/mixed_ab.log
MOE_EP_M64=2x2 PROFILE_SOURCE=1 PROFILE_CASES="wgmma3 4096" OUT=$W ./scripts/gpu_round.sh profile \
  > $W/profile.log 2>&1
tail -14 $W/profile.log
(cd $W && tar -czf $OUT/s9b.tar.gz --exclude build.log .)
