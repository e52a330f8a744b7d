#!/usr/bin/env bash
# Builds the Python extension incrementally in the CMake build folder (the one scripts/test.sh
# already built, so the library is not compiled twice) and makes `import moe_ep` work in .venv:
# python/moe_ep/*.py are linked beside the built _moe_ep*.so and a .pth file points at them.
# Editing a .py file needs no rebuild. `pip install .` builds a wheel instead (docs/python.md).
#   BUILD_DIR=build (default)   PYTHON=.venv/bin/python (default)
#   MOE_EP_CMAKE_ARGS="..."     extra configure arguments (e.g. -DGTEST_ROOT=... on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
PY=${PYTHON:-.venv/bin/python}
PY_ABS=$(command -v "$PY")
[ -x "$PY_ABS" ] || { echo "[python] no interpreter at $PY (run scripts/setup.sh)"; exit 1; }
PY_ABS=$(cd "$(dirname "$PY_ABS")" && pwd)/$(basename "$PY_ABS")

# Configure only when the build folder lacks the extension or points at another interpreter;
# otherwise `cmake --build` re-runs CMake by itself when a CMakeLists.txt changed.
cache="$BUILD/CMakeCache.txt"
if ! grep -q "^MOE_EP_PYTHON:BOOL=ON" "$cache" 2>/dev/null ||
   ! grep -q "^Python_EXECUTABLE:[A-Z]*=$PY_ABS\$" "$cache" 2>/dev/null; then
  mkdir -p "$BUILD"
  echo "[python] configure $BUILD (MOE_EP_PYTHON=ON, $PY_ABS)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_PYTHON=ON \
    -DPython_EXECUTABLE="$PY_ABS" -DPython3_EXECUTABLE="$PY_ABS" ${MOE_EP_CMAKE_ARGS:-} \
    >"$BUILD/python-configure.log" 2>&1 || { cat "$BUILD/python-configure.log"; exit 1; }
fi
cmake --build "$BUILD" --target _moe_ep -j "${JOBS:-$(nproc)}"

pkg="$BUILD/python/moe_ep"
mkdir -p "$pkg"
find "$pkg" -maxdepth 1 -type l ! -exec test -e {} \; -delete  # files removed from python/
for f in python/moe_ep/*.py; do
  ln -sf "$PWD/$f" "$pkg/"
done
site=$("$PY_ABS" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(cd "$BUILD/python" && pwd)" >"$site/moe_ep_dev.pth"
"$PY_ABS" -c "import moe_ep, os; print('[python] moe_ep', moe_ep.__version__, 'from', os.path.dirname(moe_ep._moe_ep.__file__))"
