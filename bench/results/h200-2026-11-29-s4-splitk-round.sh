#!/usr/bin/env bash
# s4-splitk device round (one call, one H200): build the GPU tests and bench_layer; bench_layer
# DSV3 (nvfp4, mxfp4_mxfp8; 1, 2, 4, 8, 32 tokens, uniform, 20 graph replays) with the decode
# split-K off (MOE_EP_DECODE_SPLITK=1), default, auto (every 4-bit recipe), forced 2 and 4, and
# off again; the whole GPU suite; compute-sanitizer memcheck and racecheck of
# GpuLayer.SmallForSanitizer with MOE_EP_DECODE_SPLITK=2 (fc1 and fc2 split). Logs in $OUT;
# steps that would end past HARD s are skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
HARD=${HARD:-330}
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
left() { [ $(($(el) + $2)) -lt "$HARD" ] || { echo "SKIP (at $(el) s): $1"; return 1; }; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
B=build-gpu
T=$B/tests/moe_ep_gpu_tests
L=$B/bench/bench_layer
summ() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran|Failure|split-k \]|kernels \]|workspace \]" "$1" | head -40; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON \
  -DGTEST_ROOT="$PWD/.deps/gtest" -DCUTLASS_DIR="$PWD/.deps/cutlass/include" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$B" -j "$(nproc)" --target moe_ep_gpu_tests bench_layer >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
rm -f "$OUT/configure.log" "$OUT/build.log"
echo "built at $(el) s"
mkdir -p "$OUT/bench"
bench() {
  local name=$1 mode=$2
  left "bench $name" 40 || return 0
  if [ "$mode" = default ]; then unset MOE_EP_DECODE_SPLITK; else export MOE_EP_DECODE_SPLITK=$mode; fi
  timeout 80 "$L" --shape dsv3 --routing uniform --iters 20 --recipes nvfp4,mxfp4_mxfp8 \
    --tokens 1,2,4,8,32 --json "$OUT/bench/bench_$name.json" >"$OUT/bench/bench_$name.log" 2>&1
  echo "== bench $name (MOE_EP_DECODE_SPLITK=$mode) rc $? at $(el) s"
  grep -E "^dsv3" "$OUT/bench/bench_$name.log"
  unset MOE_EP_DECODE_SPLITK
}
bench off 1
bench default default
bench auto auto
bench s2 2
bench s4 4
bench off2 1
(cd "$OUT" && tar -czf bench.tar.gz bench && rm -rf bench)
left tests 90 && {
  timeout 150 "$T" --gtest_output=json:"$OUT/gpu_tests.json" >"$OUT/gpu_tests.log" 2>&1
  echo "== GPU tests (default policy) rc $? at $(el) s"
  summ "$OUT/gpu_tests.log"
}
for tool in memcheck racecheck; do
  left "$tool" 40 && {
    MOE_EP_DECODE_SPLITK=2 timeout 90 "$SAN" --tool "$tool" --error-exitcode 1 "$T" \
      --gtest_filter='GpuLayer.SmallForSanitizer' >"$OUT/sanitize_$tool.log" 2>&1
    echo "== $tool (MOE_EP_DECODE_SPLITK=2) rc $? at $(el) s:" \
      "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
    summ "$OUT/sanitize_$tool.log"
  }
done
echo "done at $(el) s"
