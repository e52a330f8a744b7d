#!/usr/bin/env bash
# Builds the GPU binaries here (build/, as scripts/test.sh configures it: the CUDA backend with
# the toolkit's NCCL, the same release as the GPU machine's wheel) and packs them into
# build-carry/bins.tar.xz (git-ignored, ~15 MB: xz -9 finds the kernels' fatbin shared by every
# binary), so a device call can skip its ~200 s build: carry ["build-carry"] and run
# `scripts/gpu_round.sh carried test ...` there. Rebuild after every change to the sources.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
[ -f "$BUILD/build.ninja" ] || { echo "run ./scripts/test.sh first (configures $BUILD)"; exit 1; }
targets=(moe_ep_gpu_tests moe_ep_multigpu_tests bench_layer bench_group moe-ep)
cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"
mkdir -p build-carry
(cd "$BUILD" && tar -cf - tests/moe_ep_gpu_tests tests/multigpu/moe_ep_multigpu_tests \
  bench/bench_layer bench/bench_group moe-ep) | xz -9 -T1 >build-carry/bins.tar.xz
echo "build-carry/bins.tar.xz: $(du -h build-carry/bins.tar.xz | cut -f1) ($(git describe --always --dirty))"
