#!/usr/bin/env bash
# s3-wgmma-m64 device round (one call): build the GPU tests and bench_layer, GpuLayer.* with
# MOE_EP_WGMMA_V=3, bench_layer DSV3 v3 / v2 (nvfp4, mxfp4_mxfp8; 2048, 4096 tokens), racecheck
# of SmallForSanitizer with v3. Logs in $OUT; steps that would end past HARD s are skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
HARD=${HARD:-150}
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
left() { [ $(($(el) + $2)) -lt "$HARD" ] || { echo "SKIP (at $(el) s): $1"; return 1; }; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
B=build-gpu
T=$B/tests/moe_ep_gpu_tests
L=$B/bench/bench_layer
summ() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran|Failure|kernels \]" "$1" | head -30; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/device.txt" 2>&1
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON \
  -DGTEST_ROOT="$PWD/.deps/gtest" -DCUTLASS_DIR="$PWD/.deps/cutlass/include" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$B" -j "$(nproc)" --target moe_ep_gpu_tests bench_layer >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
echo "built at $(el) s"
left tests_v3 45 && {
  MOE_EP_WGMMA_V=3 timeout 70 "$T" --gtest_filter='GpuLayer.*' >"$OUT/tests_v3.log" 2>&1
  echo "== GpuLayer.* v3 rc $? at $(el) s"
  summ "$OUT/tests_v3.log"
}
bench() {
  local name=$1 v=$2
  left "bench $name" 25 || return 0
  MOE_EP_WGMMA_V=$v timeout 45 "$L" --shape dsv3 --routing uniform --iters 20 \
    --recipes nvfp4,mxfp4_mxfp8 --tokens 2048,4096 --json "$OUT/bench_$name.json" \
    >"$OUT/bench_$name.log" 2>&1
  echo "== bench $name (MOE_EP_WGMMA_V=$v) rc $? at $(el) s"
  grep -E "^dsv3" "$OUT/bench_$name.log"
}
bench v3 3
bench v2 2
left racecheck_v3 15 && {
  MOE_EP_WGMMA_V=3 timeout 40 "$SAN" --tool racecheck --error-exitcode 1 "$T" \
    --gtest_filter='GpuLayer.SmallForSanitizer' >"$OUT/racecheck_v3.log" 2>&1
  echo "== racecheck v3 rc $? at $(el) s: $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_v3.log" | tail -1)"
  summ "$OUT/racecheck_v3.log"
}
echo "done at $(el) s"
