#!/usr/bin/env bash
# Session 11's device calls (the `run` tool, nvidia-h200-x2, carry [".deps"]). Outputs:
# bench/results/*-s11-*. From call B on, each call ends by packing $OUT into one archive (the
# tool returns at most 8 files; call A lost its profile and ab logs to that limit), with
#   cd $OUT && tar czf all.tgz $(ls | grep -v all.tgz) && ls | grep -v all.tgz | xargs rm -rf
# appended to the command; `scripts/gpu_round.sh pack` does the same since the end of session 11.
exit 0  # a record, not a script to run

# A (PDL on the EP kernels: the tree of the first session-11 commit; tile-16 ring knobs):
PROFILE_CASES="decode 128" PROFILE_ARGS="--experts 128" PROFILE_SOURCE=1 \
  scripts/gpu_round.sh build test multigpu profile
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_PER_SM=2;this:MOE_EP_TILE_N=8" \
  AB_ARGS="--shape dsv3 --experts 128 --recipes nvfp4,mxfp4_bf16 --routing uniform --tokens 128" \
  OUT=$OUT/ab1 scripts/gpu_round.sh ab
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_TRANSPORT_PDL=0" \
  AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 1,8,128" OUT=$OUT/ab2 scripts/gpu_round.sh ab
# -> -a-gpu_tests.log (24/24), -a-multigpu_tests.log, -a-ab.log

# B (tile 16 with one fragment per consumer warp behind MOE_EP_DECODE16_FW=1; not kept):
MOE_EP_DECODE16_FW=1 GTEST_FILTER='GpuLayer*' scripts/gpu_round.sh build test sanitize
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE16_FW=1" \
  AB_ARGS="--shape dsv3 --experts 128 --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing uniform --tokens 64,128,256" \
  OUT=$OUT/ab1 scripts/gpu_round.sh ab
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE16_FW=1" \
  AB_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 256,512" OUT=$OUT/ab2 scripts/gpu_round.sh ab
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE16_FW=1" \
  AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 128" OUT=$OUT/ab3 scripts/gpu_round.sh ab
# -> -b-fw1-gpu_tests.log (19/19 with the knob), -b-decode16-fw1-{e128,dsv3,ep2}-ab.log

# C (dispatch rows by per-tile atomics; the whole tree at the end of those changes):
scripts/gpu_round.sh build test sanitize multigpu
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_ORDERED_ROWS=1" \
  AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 1,128,4096" OUT=$OUT/ab scripts/gpu_round.sh ab
BENCH_SHAPES=dsv3 TORCH_SHAPES="" scripts/gpu_round.sh benchall
# -> -c-gpu_tests.log (24/24), -c-sanitize_racecheck.log, -c-multigpu_tests.log, -c-ep_transfer.json,
#    -c-ep2-rows-ab.log, -c-layer-dsv3*, -c-quantize.*

# D (fc1 early start, branch s11-fc1-early; not kept):
scripts/gpu_round.sh build test sanitize multigpu
AB_REPS=3 AB_VARIANTS="this;this:MOE_EP_FC1_EARLY=0" \
  AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing uniform --tokens 1,2,4,8" \
  OUT=$OUT/ab1 scripts/gpu_round.sh ab
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_FC1_EARLY=0" \
  AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 1,2" OUT=$OUT/ab2 scripts/gpu_round.sh ab
# -> -d-fc1early-{ab,ep2-ab,gpu_tests,multigpu_tests}.log (GPU 25/25, multi-GPU 26/26)

# E (main b30ef55 + the capacity-4 EP test): the whole check, then Nsight Compute of tile 16
#    (E = 128, 128 tokens) and tile 8 (64 tokens):
scripts/gpu_round.sh build test sanitize multigpu cli
PROFILE_CASES="decode 128 decode 64" PROFILE_ARGS="--experts 128" PROFILE_SOURCE=1 \
  scripts/gpu_round.sh profile
# -> -e-{gpu_tests,multigpu_tests,cli,sanitize_racecheck}.log, -e-ep_transfer.json,
#    -e-ncu-tile16-e128-128{.txt,_sass.csv.gz}, -e-ncu-tile8-e128-64{.txt,_sass.csv.gz}

# F (one scale table per warp at tile 16, every 4-bit recipe; ab_base = b30ef55):
GTEST_FILTER='GpuLayer*' scripts/gpu_round.sh build test sanitize
AB_REPS=2 AB_VARIANTS="base;this" \
  AB_ARGS="--shape dsv3 --experts 128 --recipes nvfp4,mxfp4_bf16 --routing uniform --tokens 128,256" \
  OUT=$OUT/ab scripts/gpu_round.sh ab
# -> -f-onetable-{e128-ab,gpu_tests,sanitize_racecheck}.log

# G (final tree: one table for nvfp4's tile 16 only; ab_base = b30ef55):
scripts/gpu_round.sh build multigpu
AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 128" \
  OUT=$OUT/ab scripts/gpu_round.sh ab
# -> -g-multigpu_tests.log (26/26), -g-onetable-ep2-ab.log, -g-ep_transfer.json
