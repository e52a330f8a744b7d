#!/usr/bin/env bash
# s4-m64ws device round (one call, one H200): build the GPU tests and bench_layer; the whole GPU
# suite with the default rule (m64 kernel = v4); GpuLayer.* with MOE_EP_WGMMA_V=4 (v4 forced for
# every tile of 128 too) and =3 (v3); bench_layer DSV3 v3 / v4 / default (nvfp4, mxfp4_mxfp8;
# 2048, 4096 tokens); the one-row TMA box probe; memcheck + racecheck of SmallForSanitizer with v4 forced. Logs in $OUT;
# steps that would end past HARD s are skipped.
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
# The one-row TMA box swizzle probe (console only).
nvcc -std=c++17 -arch=sm_90a -o "$B/tma_probe" bench/results/h200-2026-11-29-s4-m64ws-tma_probe.cu \
  2>/dev/null && timeout 20 "$B/tma_probe"
echo "== tma probe rc $? at $(el) s"
# Benchmarks first (the question of this round), twice interleaved for run-to-run spread.
bench v3 3
bench v4 4
bench default ""
bench v3b 3
bench v4b 4
left tests_default 90 && {
  timeout 150 "$T" >"$OUT/tests_default.log" 2>&1
  echo "== moe_ep_gpu_tests (default rule, v4) rc $? at $(el) s"
  summ "$OUT/tests_default.log"
}
left sanitize_v4 40 && {
  for tool in memcheck racecheck; do
    MOE_EP_WGMMA_V=4 timeout 60 "$SAN" --tool $tool --error-exitcode 1 "$T" \
      --gtest_filter='GpuLayer.SmallForSanitizer' >>"$OUT/sanitize_v4.log" 2>&1
    echo "== $tool v4 rc $? at $(el) s"
  done
  summ "$OUT/sanitize_v4.log"
}
left tests_v4 60 && {
  MOE_EP_WGMMA_V=4 timeout 90 "$T" --gtest_filter='GpuLayer.*' >"$OUT/tests_v4.log" 2>&1
  echo "== GpuLayer.* v4 forced rc $? at $(el) s"
  summ "$OUT/tests_v4.log"
}
left tests_v3 60 && {
  MOE_EP_WGMMA_V=3 timeout 90 "$T" --gtest_filter='GpuLayer.*' >>"$OUT/tests_v4.log" 2>&1
  echo "== GpuLayer.* v3 forced rc $? at $(el) s"
}
(cd "$OUT" && tar -czf bench_json.tar.gz bench_*.json bench_v3b.log bench_v4b.log 2>/dev/null &&
  rm -f bench_*.json bench_v3b.log bench_v4b.log)
echo "done at $(el) s"
