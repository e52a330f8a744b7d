#!/usr/bin/env bash
# Installs what moe_ep needs on a fresh Debian machine: Debian packages and pinned PyPI wheels
# (into .venv). Idempotent and quiet when everything is already there.
#   ./scripts/setup.sh [--sanitizers]
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake ninja-build g++ libgtest-dev libopenblas-dev ccache clang-format)
# --sanitizers (scripts/test.sh): clang 14 with its sanitizer and libFuzzer runtimes, OpenMP and
# llvm-symbolizer, for the ASan + UBSan build and the fuzz target (Debian 12's LLVM 14, pinned by
# the package names). `./moe-ep` does not need them.
if [ "${1:-}" = "--sanitizers" ]; then
  APT_PACKAGES+=(clang-14 libclang-rt-14-dev libomp-14-dev llvm-14)
fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
if ! cmp -s scripts/requirements.txt .venv/.requirements.stamp 2>/dev/null; then
  echo "[setup] installing pinned Python packages"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  cp scripts/requirements.txt .venv/.requirements.stamp
fi

# CUTLASS/CuTe headers from the pinned wheel, copied where CMake finds them and where they can
# travel to the GPU machine (a git-ignored folder).
if [ ! -f .deps/cutlass/include/cutlass/cutlass.h ]; then
  src=$(.venv/bin/python -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")
  mkdir -p .deps/cutlass
  cp -r "$src/include" .deps/cutlass/include
  [ -d "$src/tools/util/include" ] && cp -r "$src/tools/util/include/." .deps/cutlass/include/
fi

# GoogleTest from Debian, copied beside CUTLASS so it can travel to the GPU machine (whose image
# has no GoogleTest); CMake is pointed at it there with -DGTEST_ROOT=.deps/gtest.
if [ ! -f .deps/gtest/lib/libgtest.a ]; then
  mkdir -p .deps/gtest/lib .deps/gtest/include
  cp -r /usr/include/gtest /usr/include/gmock .deps/gtest/include/
  cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a .deps/gtest/lib/
fi
