#!/usr/bin/env bash
# s4-m64ws device round 2 (one call, one H200): v4 on TMA (MOE_EP_WGMMA_V=4) and on clusters of
# 2 CTAs sharing the B rows by multicast (=5) against v3 (=3): bench_layer DSV3 (nvfp4,
# mxfp4_mxfp8; 2048, 4096 tokens), the whole GPU suite with =5, GpuLayer.* with =4, memcheck +
# racecheck of SmallForSanitizer with =5 and =4. Logs in $OUT; steps that would end past HARD s
# are skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
HARD=${HARD:-400}
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
left() { [ $(($(el) + $2)) -lt "$HARD" ] || { echo "SKIP (at $(el) s): $1"; return 1; }; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
B=build-gpu
T=$B/tests/moe_ep_gpu_tests
L=$B/bench/bench_layer
summ() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran|Failure|kernels \]|SUMMARY" "$1" | head -30; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/device.txt" 2>&1
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON \
  -DGTEST_ROOT="$PWD/.deps/gtest" -DCUTLASS_DIR="$PWD/.deps/cutlass/include" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$B" -j "$(nproc)" --target moe_ep_gpu_tests bench_layer >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
rm -f "$OUT/configure.log" "$OUT/build.log"
echo "built at $(el) s"
bench() {
  local name=$1 v=$2
  left "bench $name" 20 || return 0
  MOE_EP_WGMMA_V=$v timeout 60 "$L" --shape dsv3 --routing uniform --iters 20 \
    --recipes nvfp4,mxfp4_mxfp8 --tokens 2048,4096 --json "$OUT/bench_$name.json" \
    >"$OUT/bench_$name.log" 2>&1
  echo "== bench $name (MOE_EP_WGMMA_V=$v) rc $? at $(el) s"
  grep -E "^dsv3" "$OUT/bench_$name.log"
}
bench v3 3
bench v4 4
bench v5 5
bench v3b 3
bench v5b 5
left tests_v5 90 && {
  MOE_EP_WGMMA_V=5 timeout 150 "$T" >"$OUT/tests_v5.log" 2>&1
  echo "== moe_ep_gpu_tests with MOE_EP_WGMMA_V=5 rc $? at $(el) s"
  summ "$OUT/tests_v5.log"
}
left sanitize 60 && {
  for v in 5 4; do
    for tool in memcheck racecheck; do
      MOE_EP_WGMMA_V=$v timeout 60 "$SAN" --tool $tool --error-exitcode 1 "$T" \
        --gtest_filter='GpuLayer.SmallForSanitizer' >>"$OUT/sanitize.log" 2>&1
      echo "== $tool v$v rc $? at $(el) s"
    done
  done
  summ "$OUT/sanitize.log"
}
left tests_v4 60 && {
  MOE_EP_WGMMA_V=4 timeout 90 "$T" --gtest_filter='GpuLayer.*' >"$OUT/tests_v4.log" 2>&1
  echo "== GpuLayer.* v4 rc $? at $(el) s"
  summ "$OUT/tests_v4.log"
}
(cd "$OUT" && tar -czf bench_json.tar.gz bench_*.json bench_v3b.log bench_v5b.log 2>/dev/null &&
  rm -f bench_*.json bench_v3b.log bench_v5b.log)
echo "done at $(el) s"
