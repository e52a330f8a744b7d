#!/usr/bin/env bash
# Session 10's device calls (the `run` tool; carry [".deps"] plus "ab_base" where an ab step
# ran; ab_base/ was written first with scripts/ab_base.sh REV). Outputs: bench/results/*-s10-*.
exit 0  # a record, not a script to run

# A (nvidia-h200; tree: branch s10-prefill = main + s9-m64-if3 + s9-fc2-tma rebased;
#    ab_base = s10-prefill~1, i.e. without the TMA commit):
AB_VARIANTS="base;this;base:MOE_EP_M64=2x2i3;this:MOE_EP_M64=2x2i3" AB_REPS=2 \
  GTEST_FILTER='GpuLayer*' scripts/gpu_round.sh build test sanitize ab
# -> h200-2026-11-30-s10-a-if3-tma-ab.log, -a-gpu_tests.log

# B (nvidia-h200-x2; fc2 early + an fc1 L2 prefetch, since removed; ab_base = main a5bc0c2):
AB_REPS=2 AB_VARIANTS="base;this;this:MOE_EP_FC2_EARLY=0;this:MOE_EP_FC1_PREFETCH=0" \
  AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,4,8,128" \
  GTEST_FILTER='GpuLayer*' scripts/gpu_round.sh build test sanitize multigpu ab
# (the multi-GPU suite ran 0 tests: GoogleTest reads GTEST_FILTER itself; fixed in 7019faf)
# -> -b-starts-ab.log

# C (nvidia-h200-x2; main + fc2 early + tight max_tiles, 21e466b; ab_base = a5bc0c2):
AB_REPS=2 AB_VARIANTS="base;this;this:MOE_EP_FC2_EARLY=0" \
  AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing uniform --tokens 1,2,8,128,1024" \
  scripts/gpu_round.sh build test sanitize multigpu ab
AB_VARIANTS="base;this" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 1,8,128" \
  scripts/gpu_round.sh ab
# -> -c-fc2early-tiles-ab.log, -c-fc2early-tiles-ep2-ab.log, -c-gpu_tests.log, -c-multigpu_tests.log

# D (nvidia-h200; same trees, per-replay traces):
AB_REPS=3 MOE_EP_BENCH_TRACE=1 AB_VARIANTS="base;this;this:MOE_EP_FC2_EARLY=0" \
  AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_bf16 --routing uniform --tokens 1,128" \
  scripts/gpu_round.sh build ab
# -> h200-2026-11-30-s10-d-trace128-ab.log

# E (nvidia-h200-x2; main 4bd7d6e):
TORCH_SHAPES="" scripts/gpu_round.sh build test sanitize multigpu benchall
# -> -e-gpu_tests.log, -e-multigpu_tests.log, -e-ep_transfer.json, -e-layer-*, -e-quantize.*

# F (nvidia-h200-x2; the narrow tile-16 consumer, 1c61771; ab_base = main 4bd7d6e):
AB_REPS=2 AB_VARIANTS="base;this" \
  AB_ARGS="--shape dsv3 --experts 128 --recipes nvfp4,mxfp4_bf16 --routing uniform --tokens 64,128,256" \
  scripts/gpu_round.sh build test sanitize multigpu ab
AB_VARIANTS="base;this" AB_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 256,512" \
  scripts/gpu_round.sh ab
AB_VARIANTS="base;this" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4,mxfp4_bf16 --tokens 32,128" \
  scripts/gpu_round.sh ab   # printed nothing: --ep takes one recipe, and the grep hid the usage
#   error (fixed in gpu_round.sh); EP numbers come from call G
# -> -f-narrow16-e128-ab.log, -f-narrow16-dsv3-ab.log, -f-gpu_tests.log, -f-multigpu_tests.log,
#    -f-sanitize_*.log

# G (nvidia-h200-x2; main 1c61771, the final tree):
BENCH_SHAPES=dsv3 TORCH_SHAPES="" scripts/gpu_round.sh build benchall
# -> -final-layer-dsv3*, -final-quantize.*

# H (nvidia-h200-x2; main, scripts and docs only changed since G): the opt-in fp8 path again
scripts/gpu_round.sh build fp8
# -> -h-fp8-ab.log
