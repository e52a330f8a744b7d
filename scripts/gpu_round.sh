#!/usr/bin/env bash
# The whole GPU round on the H200 machine in one go: build there, run the GPU tests and the
# benchmarks, write logs and JSON to $OUT (or ./gpu-out).
#   scripts/gpu_round.sh [carried] [build] [test] [sanitize] [multigpu] [cli] [python] [bench]
#                        [benchall] [profile] [ab] [pack]
#                        (default: build test sanitize multigpu cli python bench)
#   carried = first, instead of build: the binaries that tools/pack_carry.sh built on the
#   development machine (build-carry/bins.tar.xz, carry ["build-carry"]) unpacked into
#   build-carried, which the later steps use (the python and ab steps still build).
#   test = the GPU tests (GTEST_FILTER=... narrows them); sanitize = compute-sanitizer memcheck
#   and racecheck on a small case of every recipe.
#   multigpu = the multi-GPU suite at W = 2, and at 4 / 8 where that many GPUs are present.
#   cli = `moe-ep run` and `moe-ep check` on the GPU(s); python = the Python package's tests.
#   bench = every benchmark program once with its defaults (BENCH_ARGS=... is passed to each).
#   benchall = every case of the record set in bench/results (its README maps the files):
#   bench_layer for dsv3 / qwen3 / gpt-oss at EP = 1, EP = 2 / 4 / 8 where that
#   many GPUs are present (BENCH_EP="8" narrows it; the shapes of BENCH_EP_SHAPES, default all
#   three) with the single-GPU reference of the same per-rank work, the PyTorch baseline of each
#   shape (TORCH_SHAPES) and the plots, packed into $OUT/bench.tar.gz; give the tree's commit for
#   the records as MOE_EP_COMMIT=<hash> in the call.
#   profile = Nsight Compute of the decode GEMM at 1 and 128 tokens and the wgmma GEMM at 4096
#   tokens (PROFILE_CASES="kernel tokens" pairs, e.g. "wgmma 4096"; PROFILE_ARGS adds
#   bench_layer arguments; PROFILE_SOURCE=1 adds per-instruction stall samples, which
#   tools/ncu_stalls.py summarizes).
#   ab = this tree against another revision, both built in the same call (machines differ
#   between calls by several percent): `tools/ab_base.sh REV` first, on the development machine,
#   writes that revision's tree to ab_base/ (git-ignored: carry [".deps", "ab_base"]); the step
#   builds bench_layer there and runs AB_ARGS (default: DSV3, nvfp4 and mxfp4_mxfp8, both
#   routings, 1024-4096 tokens) AB_REPS times (default 2), alternating base and this tree. The
#   table goes to $OUT/ab.log, each run followed by a "# clocks GPU n:" line per GPU
#   (tools/smi_trace.sh: SM clock and power cap during the run).
#   pack = last: everything under $OUT into $OUT/all.tgz (the device tool returns few files).
# Call it through the device tool with carry [".deps"] (CUTLASS + GoogleTest headers), or
# ["build-carry"] for `carried`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
steps="${*:-build test sanitize multigpu cli python bench}"
has() { [[ " $steps " == *" $1 "* ]]; }

# NVLink multicast stays off: the layer's transport does not use it and these machines lack it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null || true)
# The builds link the wheel's NCCL and name its folder in their run path (docs/protocol.md), so
# every step runs as a user's shell would, without LD_LIBRARY_PATH; only the ab step's base tree
# gets it (a revision older than that linked the image's own NCCL, another release).
BUILD=${BUILD_DIR:-build-gpu}
JOBS=$(nproc)
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv \
  >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

# Configures source tree $1 into build folder $2 (log $3) with this machine's NCCL and the
# carried CUTLASS / GoogleTest headers; further arguments go to cmake.
configure() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON \
    ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT="$PWD/.deps/gtest" \
    -DCUTLASS_DIR="$PWD/.deps/cutlass/include" "${@:4}" >"$3" 2>&1
}

if has carried; then
  # The development machine's build links the toolkit's libnccl (the same release) by a run
  # path that does not exist here: the wheel's lib folder stands in for it.
  echo "== carried binaries (build-carry/bins.tar.xz, tools/pack_carry.sh) -> build-carried"
  BUILD=build-carried
  mkdir -p "$BUILD" && tar -xJf build-carry/bins.tar.xz -C "$BUILD" || exit 1
  [ -n "$NCCL_DIR" ] && export LD_LIBRARY_PATH="$NCCL_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if has build; then
  echo "== build ($BUILD, $JOBS jobs)"
  configure . "$BUILD" "$OUT/configure.log" || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$JOBS" >"$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
  echo "build ok"
fi

if has test; then
  echo "== GPU tests"
  "$BUILD/tests/moe_ep_gpu_tests" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} \
    --gtest_output=json:"$OUT/gpu_tests.json" >"$OUT/gpu_tests.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests ran|Failure|error" \
    "$OUT/gpu_tests.log" | head -60
fi

if has sanitize; then
  # compute-sanitizer memcheck and racecheck on a tiny case of every recipe.
  echo "== compute-sanitizer"
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    "$SAN" --tool "$tool" --error-exitcode 1 "$BUILD/tests/moe_ep_gpu_tests" \
      --gtest_filter='GpuLayer.SmallForSanitizer' >"$OUT/sanitize_$tool.log" 2>&1 || status=1
    echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.log" | tail -1)"
  done
fi

if has multigpu; then
  # The suite at W = 2, and at 4 and 8 where that many GPUs are present (MOE_EP_TEST_WORLD, one
  # process per GPU; it skips below 2 GPUs). W = 2 keeps the old file names.
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  for w in 2 4 8; do
    [ "$w" = 2 ] || [ "$ngpu" -ge "$w" ] || continue
    sfx=""
    [ "$w" = 2 ] || sfx="_w$w"
    echo "== multi-GPU tests, W = $w (one process per GPU; skip below $w GPUs)"
    # GTEST_FILTER (read by GoogleTest itself) narrows the GPU tests only.
    env -u GTEST_FILTER MOE_EP_TEST_WORLD=$w MOE_EP_BENCH_JSON="$OUT/ep_transfer$sfx.json" \
      "$BUILD/tests/multigpu/moe_ep_multigpu_tests" \
      --gtest_output=json:"$OUT/multigpu_tests$sfx.json" >"$OUT/multigpu_tests$sfx.log" 2>&1 ||
      status=1
    grep -E "^\[ +(OK|FAILED|SKIPPED) |tests ran|Failure|rank [0-9]|DSV3|blocks|^ +[0-9]+ |decode" \
      "$OUT/multigpu_tests$sfx.log" | head -80
  done
fi

if has cli; then
  echo "== moe-ep command on the GPU(s)"
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  { ldd "$BUILD/moe-ep" | grep nccl && "$BUILD/moe-ep" run && "$BUILD/moe-ep" check --tokens 0,1,7,128 &&
    { [ "$ngpu" -lt 2 ] || "$BUILD/moe-ep" check --gpus 2 --tokens 0,1,64; }; } \
    >"$OUT/cli.log" 2>&1 || status=1
  grep -vE "^\[moe-ep\]" "$OUT/cli.log" | tail -40
fi

if has python; then
  echo "== Python package (torch tests on the GPU)"
  { PYTHON=python3 BUILD_DIR="$BUILD" MOE_EP_CMAKE_ARGS="-DGTEST_ROOT=$PWD/.deps/gtest" \
      ./scripts/build_python.sh &&
    python3 -m pytest -q -rs tests/python && python3 examples/vllm_style_layer.py; } \
    >"$OUT/python.log" 2>&1 || status=1
  tail -25 "$OUT/python.log"
fi

if has bench; then
  echo "== benchmarks"
  for b in "$BUILD"/bench/*; do
    [ -x "$b" ] && [ -f "$b" ] || continue
    name=$(basename "$b")
    "$b" --json "$OUT/$name.json" ${BENCH_ARGS:-} >"$OUT/$name.log" 2>&1 || status=1
    tail -25 "$OUT/$name.log"
  done
fi

if has profile; then
  # Nsight Compute on the kernels the targets hinge on: the decode GEMM at 1 and 128 tokens and
  # the wgmma GEMM at 4096 tokens (DSV3 nvfp4; two launches each = fc1 and fc2; clocks left
  # alone). PROFILE_CASES="kernel tokens" pairs narrow it.
  echo "== ncu profiles -> $OUT/profile.tar.gz (ncu_*.txt, .log, _sass.csv.gz)"
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  sections="--section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section InstructionStats --section MemoryWorkloadAnalysis --section Occupancy"
  # PROFILE_ARGS adds bench_layer arguments (e.g. "--experts 128").
  # PROFILE_SOURCE=1 adds the per-instruction stall samples (SourceCounters), written as
  # $OUT/ncu_<kernel>_<tokens>_sass.csv.gz (every SASS line with its samples by stall reason).
  [ "${PROFILE_SOURCE:-0}" = 1 ] && sections="$sections --section SourceCounters"
  # shellcheck disable=SC2086
  set -- ${PROFILE_CASES:-decode 1 decode 128 wgmma 4096}
  while [ $# -ge 2 ]; do
    kern=$1 tok=$2
    shift 2
    rep="$OUT/ncu_${kern}_$tok"
    # shellcheck disable=SC2086
    timeout 240 "$NCU" --clock-control none -k "regex:sm90_moe_$kern" -c 2 $sections -o "$rep" \
      "$BUILD/bench/bench_layer" --shape dsv3 --recipes nvfp4 --routing uniform --tokens "$tok" \
      --iters 3 ${PROFILE_ARGS:-} >"$rep.log" 2>&1 || status=1
    "$NCU" -i "$rep.ncu-rep" --page details >"$rep.txt" 2>&1 || status=1
    if [ "${PROFILE_SOURCE:-0}" = 1 ]; then
      "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$rep"_sass.csv.gz
    fi
    rm -f "$rep.ncu-rep"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|No Eligible|Achieved Occupancy" \
      "$rep.txt" | head -12
  done
  # The device returns few files: one archive.
  (cd "$OUT" && tar -czf profile.tar.gz ncu_* && rm -f ncu_*)
fi

if has benchall; then
  echo "== the record set of bench/results -> $OUT/bench.tar.gz"
  B="$OUT/bench"
  mkdir -p "$B"
  # The records' commit: MOE_EP_COMMIT as the caller gives it (the device's copy of the tree can
  # carry the git metadata of an older commit), else git describe, which marks a tree that
  # differs from that metadata "-dirty".
  export MOE_EP_COMMIT=${MOE_EP_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  # BENCH_SHAPES / TORCH_SHAPES narrow the shapes (e.g. TORCH_SHAPES="" when the baseline of
  # this device is already recorded).
  for shape in ${BENCH_SHAPES-dsv3 qwen3 gpt-oss}; do
    "$BUILD/bench/bench_layer" --shape $shape --json "$B/layer-$shape.json" \
      >"$B/layer-$shape.log" 2>&1 || status=1
    torch_json=""
    if [[ " ${TORCH_SHAPES-dsv3 qwen3 gpt-oss} " == *" $shape "* ]]; then
      python3 bench/torch_baseline.py --shape $shape --json "$B/torch-$shape.json" \
        >"$B/torch-$shape.log" 2>&1 || status=1
      torch_json="$B/torch-$shape.json"
    fi
    python3 bench/plot_results.py "$B/layer-$shape.json" $torch_json \
      "$B/layer-$shape.png" >>"$B/plot.log" 2>&1 || true
    grep -E "^(shape| *$shape)" "$B/layer-$shape.log" | grep -E "uniform|shape" | head -40
  done
  # The opt-in fp8 path of mxfp4_mxfp8 (RecipeConfig::fp8_mma) in prefill.
  for shape in ${BENCH_FP8_SHAPES-dsv3 qwen3}; do
    "$BUILD/bench/bench_layer" --shape $shape --recipes mxfp4_mxfp8 --fp8-mma --routing uniform \
      --tokens 512,2048,4096 --json "$B/layer-$shape-fp8.json" >"$B/layer-$shape-fp8.log" 2>&1 ||
      status=1
  done
  # EP = 2, 4 and 8 where that many GPUs are present (BENCH_EP narrows it, e.g. BENCH_EP=8), for
  # the shapes of BENCH_EP_SHAPES (default all three; the PyTorch EP = 2 baseline exists for DSV3).
  for w in ${BENCH_EP-2 4 8}; do
    [ "$ngpu" -ge "$w" ] || continue
    for shape in ${BENCH_EP_SHAPES-dsv3 qwen3 gpt-oss}; do
      for r in nvfp4 mxfp4_mxfp8 mxfp4_bf16 bf16; do
        "$BUILD/bench/bench_layer" --ep "$w" --shape $shape --recipes $r \
          --json "$B/layer-$shape-ep$w-$r.json" >"$B/layer-$shape-ep$w-$r.log" 2>&1 || status=1
        grep -E "^$shape .* uniform " "$B/layer-$shape-ep$w-$r.log" | head -8
      done
      j=$(ls "$B"/layer-$shape-ep"$w"-*.json | paste -sd, -)
      torch=""
      [ "$w" = 2 ] && [ "$shape" = dsv3 ] && torch=bench/results/h200x2-ep2-dsv3-torch.json
      python3 bench/plot_results.py "$j" $torch "$B/layer-$shape-ep$w.png" >>"$B/plot.log" 2>&1 ||
        true
      # The single-GPU time of the same per-rank work (E / W experts, the same T): the EP target.
      e=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[0]['E'])" \
        "$B/layer-$shape-ep$w-nvfp4.json" 2>/dev/null) || continue
      "$BUILD/bench/bench_layer" --shape $shape --experts $((e / w)) --recipes nvfp4 \
        --routing uniform --tokens 1,128,4096 --json "$B/layer-$shape-ep1-e$((e / w)).json" \
        >"$B/layer-$shape-ep1-e$((e / w)).log" 2>&1 || status=1
    done
  done
  tar -C "$OUT" -czf "$OUT/bench.tar.gz" bench && rm -rf "$B"
fi
if has ab; then
  echo "== A/B -> $OUT/ab.log"
  if [ ! -f ab_base/CMakeLists.txt ]; then
    echo "ab: no ab_base/ (run tools/ab_base.sh REV first)"
    status=1
  else
    configure ab_base build-ab-base "$OUT/ab_configure.log" &&
      cmake --build build-ab-base -j "$JOBS" --target bench_layer >"$OUT/ab_build.log" 2>&1 ||
      { grep -E "error|Error" "$OUT/ab_build.log" | head -20; status=1; }
    # shellcheck disable=SC2206
    args=(${AB_ARGS:---shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing both --tokens 1024,2048,4096})
    for rep in $(seq "${AB_REPS:-2}"); do
      for side in base this; do
        echo "# $side (run $rep)"
        bin="$BUILD/bench/bench_layer"
        libs=""
        if [ "$side" = base ]; then
          bin=build-ab-base/bench/bench_layer
          [ -n "$NCCL_DIR" ] && libs="LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}"
        fi
        # Each run under tools/smi_trace.sh: its "# clocks GPU n:" lines say which SM clocks and
        # power state it ran at (the board's 700 W cap lowers the clock partway through runs).
        trace=$(mktemp)
        # shellcheck disable=SC2086
        tools/smi_trace.sh "$trace" env $libs timeout 200 "$bin" "${args[@]}" --iters 20 2>&1 |
          grep -E "uniform|zipf|rror|failed|--ep|stages|NVLink|replays|graph of|# clocks|^(dsv3|qwen3|gpt-oss) "
        rm -f "$trace"
      done
    done >"$OUT/ab.log"
    cat "$OUT/ab.log"
  fi
fi

if has pack; then
  (
    cd "$OUT" || exit 1
    mapfile -t files < <(ls -A | grep -vx all.tgz)
    if [ ${#files[@]} -gt 0 ]; then
      tar -czf all.tgz "${files[@]}" && rm -rf "${files[@]}"
    fi
  ) || status=1
  echo "== packed $OUT into all.tgz ($(du -h "$OUT/all.tgz" 2>/dev/null | cut -f1))"
fi

exit $status
