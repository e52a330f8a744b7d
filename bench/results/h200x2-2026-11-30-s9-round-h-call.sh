#!/usr/bin/env bash
# Session 9, call H (nvidia-h200-x2, carry [".deps"]): the final tree of the session (m64 shape
# 2x2 by default with branch-free loads, tile 160 above 17 rows): GPU tests, sanitizers,
# multi-GPU suite, then every
# BENCH.md case (the PyTorch baseline of this machine is recorded: TORCH_SHAPES="").
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build test sanitize multigpu > $W/round.log 2>&1
grep -E "build ok|memcheck|racecheck|PASSED|FAILED|tests ran|Failure|error" $W/round.log | head -20
TORCH_SHAPES="" OUT=$W ./scripts/gpu_round.sh benchall > $W/benchall.log 2>&1
grep -E "uniform|shape" $W/benchall.log | head -60
(cd $W && tar -czf $OUT/s9h.tar.gz --exclude build.log .)
