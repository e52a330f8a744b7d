#!/usr/bin/env bash
# clang-format (Google base, 100 columns) over the project's C++ and CUDA sources.
# --check: fail if any file is not formatted; otherwise format in place.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files -co --exclude-standard -- '*.h' '*.cpp' '*.cu' '*.cuh' | grep -v '^\.deps/' || true)
[ -z "$files" ] && exit 0
if [ "${1:-}" = "--check" ]; then
  # shellcheck disable=SC2086
  clang-format --dry-run --Werror $files
else
  # shellcheck disable=SC2086
  clang-format -i $files
fi
