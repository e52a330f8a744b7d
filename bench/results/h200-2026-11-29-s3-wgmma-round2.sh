#!/usr/bin/env bash
# Second s3-wgmma device round (the lean v3): build, GpuLayer.* with MOE_EP_WGMMA_V=3,
# bench_layer A/B v2 / v3 (and v4), racecheck with v3, the v4 test subset. Output in $OUT/r,
# packed into $OUT/wgmma2.tar.gz after every step; steps that would end past HARD s skip.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
R=$OUT/r
mkdir -p "$R"
HARD=${HARD:-125}
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
left() { [ $(($(el) + $2)) -lt "$HARD" ] || { echo "SKIP (at $(el) s): $1"; return 1; }; }
pack() { tar -C "$OUT" -czf "$OUT/wgmma2.tar.gz" r; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
B=build-gpu
T=$B/tests/moe_ep_gpu_tests
L=$B/bench/bench_layer
summ() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran|Failure|kernels \]" "$1" | head -30; }

OUT=$R ./scripts/gpu_round.sh build || { pack; exit 1; }
echo "built at $(el) s"
left tests_v3 40 && {
  MOE_EP_WGMMA_V=3 timeout 80 "$T" --gtest_filter='GpuLayer.*' >"$R/tests_v3.log" 2>&1
  echo "== GpuLayer.* v3 rc $? at $(el) s"
  summ "$R/tests_v3.log"
  pack
}
bench() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  left "bench $name" 8 || return 0
  env "${envs[@]}" timeout 40 "$L" --shape dsv3 --routing uniform --iters 20 \
    --json "$R/bench_$name.json" "$@" >"$R/bench_$name.log" 2>&1
  echo "== bench $name (${envs[*]}) rc $? at $(el) s"
  grep -E "^dsv3" "$R/bench_$name.log"
  pack
}
bench v3 MOE_EP_WGMMA_V=3 -- --recipes nvfp4,mxfp4_mxfp8,bf16 --tokens 2048,4096
bench v2 MOE_EP_WGMMA_V=2 -- --recipes nvfp4,mxfp4_mxfp8,bf16 --tokens 2048,4096
left racecheck_v3 10 && {
  MOE_EP_WGMMA_V=3 timeout 40 "$SAN" --tool racecheck --error-exitcode 1 "$T" \
    --gtest_filter='GpuLayer.SmallForSanitizer' >"$R/racecheck_v3.log" 2>&1
  echo "== racecheck v3 rc $? at $(el) s: $(grep -E 'RACECHECK SUMMARY' "$R/racecheck_v3.log" | tail -1)"
  summ "$R/racecheck_v3.log"
  pack
}
bench v4 MOE_EP_WGMMA_V=4 -- --recipes nvfp4 --tokens 4096
left tests_v4 20 && {
  MOE_EP_WGMMA_V=4 timeout 40 "$T" --gtest_filter='GpuLayer.Dsv3AllRecipes:GpuLayer.Qwen3Capacity4096:GpuLayer.GraphReplayWithNumTokens:GpuLayer.SmallForSanitizer:GpuLayer.UnfinalizedMatchesFinalized:GpuLayer.EdgeRouting' \
    >"$R/tests_v4.log" 2>&1
  echo "== GpuLayer subset v4 rc $? at $(el) s"
  summ "$R/tests_v4.log"
  pack
}
echo "done at $(el) s"
pack && rm -rf "$R"
