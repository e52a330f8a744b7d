#!/usr/bin/env bash
# Runs every test that this machine can run: installs dependencies, builds (CPU library, and the
# CUDA kernels when nvcc is present), checks formatting, runs the C++ tests and the Python tests.
# GPU tests skip with a reason where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
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
