#!/usr/bin/env bash
# The s3-wgmma device round (one call on the H200): build, GpuLayer tests with v3 (default) and
# a subset with v4, bench_layer A/B of v2 / v3 / v4 and ring depths, racecheck. Everything goes
# to $OUT/r, packed into $OUT/wgmma.tar.gz; a summary to stdout. Steps that would end past HARD s skip.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
R=$OUT/r
mkdir -p "$R"
HARD=${HARD:-235}  # a step starts only if its expected end is before HARD s
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
left() {  # name, expected_s
  [ $(($(el) + $2)) -lt "$HARD" ] || { echo "SKIP (at $(el) s): $1"; return 1; }
}
pack() { tar -C "$OUT" -czf "$OUT/wgmma.tar.gz" r; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
B=build-gpu
T=$B/tests/moe_ep_gpu_tests
L=$B/bench/bench_layer
summ() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran|Failure|kernels \]" "$1" | head -30; }

OUT=$R ./scripts/gpu_round.sh build || { pack; exit 1; }
echo "built at $(el) s"

left tests_v3 50 && {
  timeout 110 "$T" --gtest_filter='GpuLayer.*' >"$R/tests_v3.log" 2>&1
  echo "== GpuLayer.* v3 (default) rc $? at $(el) s"
  summ "$R/tests_v3.log"
  pack
}
bench() {  # name, env..., then bench args after --
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  left "bench $name" 25 || return 0
  env "${envs[@]}" timeout 60 "$L" --shape dsv3 --routing uniform --iters 20 \
    --json "$R/bench_$name.json" "$@" >"$R/bench_$name.log" 2>&1
  echo "== bench $name (${envs[*]}) rc $? at $(el) s"
  grep -E "^dsv3" "$R/bench_$name.log"
  pack
}
bench v3 MOE_EP_WGMMA_V=3 -- --recipes nvfp4,mxfp4_mxfp8 --tokens 512,2048,4096
bench v2 MOE_EP_WGMMA_V=2 -- --recipes nvfp4,mxfp4_mxfp8 --tokens 512,2048,4096
left racecheck_v3 45 && {
  timeout 90 "$SAN" --tool racecheck --error-exitcode 1 "$T" \
    --gtest_filter='GpuLayer.SmallForSanitizer' >"$R/racecheck_v3.log" 2>&1
  echo "== racecheck v3 rc $? at $(el) s: $(grep -E 'RACECHECK SUMMARY' "$R/racecheck_v3.log" | tail -1)"
  summ "$R/racecheck_v3.log"
  pack
}
left tests_v4 30 && {
  MOE_EP_WGMMA_V=4 timeout 60 "$T" --gtest_filter='GpuLayer.Dsv3AllRecipes:GpuLayer.Qwen3Capacity4096:GpuLayer.GraphReplayWithNumTokens:GpuLayer.SmallForSanitizer:GpuLayer.UnfinalizedMatchesFinalized:GpuLayer.EdgeRouting' \
    >"$R/tests_v4.log" 2>&1
  echo "== GpuLayer subset v4 rc $? at $(el) s"
  summ "$R/tests_v4.log"
  pack
}
bench v4 MOE_EP_WGMMA_V=4 -- --recipes nvfp4,mxfp4_mxfp8 --tokens 2048,4096
bench v3_ring5_6 MOE_EP_WGMMA_V=3 MOE_EP_WGMMA_RING=5,6 -- --recipes nvfp4 --tokens 2048,4096
bench v3_ring3_13 MOE_EP_WGMMA_V=3 MOE_EP_WGMMA_RING=3,13 -- --recipes nvfp4 --tokens 2048,4096
bench v4_ring3_27 MOE_EP_WGMMA_V=4 MOE_EP_WGMMA_RING=3,27 -- --recipes nvfp4 --tokens 4096
left racecheck_v4 45 && {
  MOE_EP_WGMMA_V=4 timeout 60 "$SAN" --tool racecheck --error-exitcode 1 "$T" \
    --gtest_filter='GpuLayer.SmallForSanitizer' >"$R/racecheck_v4.log" 2>&1
  echo "== racecheck v4 rc $? at $(el) s: $(grep -E 'RACECHECK SUMMARY' "$R/racecheck_v4.log" | tail -1)"
}
echo "done at $(el) s"
pack && rm -rf "$R"
