#!/usr/bin/env bash
# Runs every test that this machine can run: installs dependencies, builds (CPU library, and the
# CUDA kernels when nvcc is present), checks formatting, runs the C++ tests and the Python tests.
# GPU tests skip with a reason where no GPU is present. Then a second, CPU-only build with
# AddressSanitizer + UndefinedBehaviorSanitizer (clang) runs the C++ tests again, and the fuzz
# target of the safetensors reader and `moe-ep --load` runs for FUZZ_SECONDS (default 60).
#   SANITIZE=0   skips the sanitizer build and the fuzzing (a quick local run; CI runs them)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SANITIZE:-1}" != 0 ]; then ./scripts/setup.sh --sanitizers; else ./scripts/setup.sh; fi
BUILD=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

echo "[test] format check"
./scripts/format.sh --check

echo "[test] configure + build ($BUILD)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_TESTS=ON -DMOE_EP_BENCH=ON \
  -DPython3_EXECUTABLE="$PWD/.venv/bin/python" >"$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; exit 1; }
grep "moe_ep:" "$BUILD.configure.log" || true
cmake --build "$BUILD" -j "$JOBS"

echo "[test] C++ tests"
(cd "$BUILD" && ctest --output-on-failure --no-tests=error)

if [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then
  echo "[test] Python tests"
  ./scripts/build_python.sh
  .venv/bin/python -m pytest -q tests/python
fi

if [ "${SANITIZE:-1}" != 0 ]; then
  SAN=${SAN_BUILD_DIR:-build-asan}
  t0=$SECONDS
  echo "[test] sanitizer build: ASan + UBSan, clang, CPU only ($SAN)"
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$SAN" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMOE_EP_CUDA=OFF -DMOE_EP_SANITIZE=ON -DMOE_EP_FUZZ=ON -DMOE_EP_TESTS=ON -DMOE_EP_BENCH=OFF \
    >"$SAN.configure.log" 2>&1 || { cat "$SAN.configure.log"; exit 1; }
  cmake --build "$SAN" -j "$JOBS"
  echo "[test] sanitizer build took $((SECONDS - t0)) s; C++ tests under ASan + UBSan"
  t0=$SECONDS
  # Any report fails the test that caused it (no recovery, leaks checked at exit).
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  (cd "$SAN" && ctest -j "$JOBS" --output-on-failure --no-tests=error)
  echo "[test] sanitized C++ tests took $((SECONDS - t0)) s"

  FUZZ_SECONDS=${FUZZ_SECONDS:-60}
  echo "[test] fuzzing the safetensors reader and --load for $FUZZ_SECONDS s (ASan + UBSan)"
  mkdir -p "$SAN/fuzz-corpus" "$SAN/fuzz-crashes"
  # New inputs go to $SAN/fuzz-corpus; the committed seeds are read only. A crash leaves its
  # input in $SAN/fuzz-crashes: add it to tests/fuzz/regressions and fix the reader.
  "$SAN/tests/moe_ep_fuzz_load" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -timeout=20 \
    -rss_limit_mb=3000 -dict=tests/fuzz/safetensors.dict -artifact_prefix="$SAN/fuzz-crashes/" \
    -print_final_stats=1 "$SAN/fuzz-corpus" tests/fuzz/corpus 2>"$SAN/fuzz.log" ||
    { tail -60 "$SAN/fuzz.log"; echo "[test] the fuzzer found a crash: $(ls "$SAN/fuzz-crashes")"; exit 1; }
  grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" "$SAN/fuzz.log" || true
  CKPT_FUZZ_SECONDS=${CKPT_FUZZ_SECONDS:-30}
  echo "[test] fuzzing the checkpoint loaders' JSON files for $CKPT_FUZZ_SECONDS s (ASan + UBSan)"
  mkdir -p "$SAN/fuzz-ckpt-corpus"
  "$SAN/tests/moe_ep_fuzz_checkpoint" -max_total_time="$CKPT_FUZZ_SECONDS" -max_len=16384 \
    -timeout=20 -rss_limit_mb=3000 -dict=tests/fuzz/checkpoint.dict \
    -artifact_prefix="$SAN/fuzz-crashes/" -print_final_stats=1 "$SAN/fuzz-ckpt-corpus" \
    tests/fuzz/checkpoint_corpus 2>"$SAN/fuzz-ckpt.log" ||
    { tail -60 "$SAN/fuzz-ckpt.log"; echo "[test] the fuzzer found a crash: $(ls "$SAN/fuzz-crashes")"; exit 1; }
  grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" "$SAN/fuzz-ckpt.log" || true
fi
echo "[test] all passed"
