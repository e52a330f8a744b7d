#!/usr/bin/env bash
# Session 30's device calls (nvidia-h200, the only kind lent), in order; carry [".deps"] (and
# "ab_base" where an A/B builds another revision: scripts/ab_base.sh REV first). All timings are
# medians of 20 CUDA-graph replays, uniform routing unless marked, us.
#
# Call A (branch s30-shared-epi 15f79dc = session 29's s29-fp8-shared-epi rebased on main, one
# epilogue at N = 160 for every MMA width of the persistent fp8 kernel; ab_base = main b3fe352):
# GPU tests 36/36 (the 11 fp8 hashes unchanged, dsv3 T=1 b3060afdcec701e7 ... qwen3 T=400
# 167e1e4b31ce4d76; fp8-persistent 3.634e-3), memcheck 0 errors, racecheck 0 hazards. This run
# covers main's session-29 review (test refactors), which the branch contains. A/B with
# MOE_EP_FP8=1 (-a-fp8-shared-epi-{qwen3,dsv3}-ab.log), base first: Qwen3 2048 392.1 / 393.3 ->
# 402.9 / 402.5, 4096 741.0 / 741.2 -> 744.0 / 742.6; DSV3 2048 3078.5 / 3130.1 -> 2976.7 /
# 3119.5, 4096 4589.2 / 4580.8 -> 4509.0 / 4471.7.
export MOE_EP_COMMIT=15f79dc; export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg_$2.log 2>&1 && cmake --build $2 -j $3 $4 > $OUT/build_$2.log 2>&1; echo "$2 rc=$?"; }; date +%T; cfg . build-gpu 13 "" & cfg ab_base build-ab-base 3 "--target bench_layer" & wait; date +%T; timeout 200 build-gpu/tests/moe_ep_gpu_tests > $OUT/gpu_tests.log 2>&1; echo tests rc=$?; grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tests ran" $OUT/gpu_tests.log | head; grep -E "fp8-vs-cpu|fp8-pers|hash|one-expert" $OUT/gpu_tests.log | head -40; date +%T; timeout 100 scripts/gpu_round.sh sanitize 2>&1 | tail -3; date +%T; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 90 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_qwen3.log; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 150 scripts/gpu_round.sh ab >/dev/null; cat $OUT/ab_qwen3.log $OUT/ab.log | grep -v "^#.*clocks" | head -60; date +%T
# Call B (branch s30-shared-epi 318d22e: the fp8 kernel templated on its width list, the fine
# list with one epilogue, the coarse list with one per width as on main; ab_base = main):
# GpuLayer.Fp8* and SmallForSanitizer 4/4 with the same 11 hashes, memcheck 0, racecheck 0.
# A/B (-b-fp8-epi-per-list-{qwen3,dsv3}-ab.log): Qwen3 2048 389.7 / 391.2 -> 407.5 / 406.8
# (fine list forced: 399.9 / 398.7), 4096 736.5 / 737.5 -> 754.0 / 753.1 (766.8 / 766.6);
# DSV3 512 2378.1 / 2386.3 -> 2395.6 / 2396.5, 2048 3086.6 / 3129.2 -> 3118.3 / 3099.0, 4096
# 4540.9 / 4550.0 -> 4417.3 / 4489.6. Not kept (Qwen3's coarse-only kernel slower than main's
# although its K loops have the same SASS per stage).
export MOE_EP_COMMIT=318d22e; export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg_$2.log 2>&1 && cmake --build $2 -j $3 $4 > $OUT/build_$2.log 2>&1; echo "$2 rc=$?"; }; date +%T; cfg . build-gpu 13 "--target moe_ep_gpu_tests bench_layer" & cfg ab_base build-ab-base 3 "--target bench_layer" & wait; date +%T; timeout 120 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Fp8*:GpuLayer.SmallForSanitizer' > $OUT/fp8_tests.log 2>&1; echo tests rc=$?; grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" $OUT/fp8_tests.log | head; grep -E "fp8-vs-cpu|fp8-pers" $OUT/fp8_tests.log | head -14; timeout 100 scripts/gpu_round.sh sanitize 2>&1 | tail -2; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 90 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_qwen3.log; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 512,2048,4096" timeout 150 scripts/gpu_round.sh ab >/dev/null; cat $OUT/ab_qwen3.log $OUT/ab.log | grep -v "^#.*clocks" | grep -v "^shape" | head -60
# Call C (main b3fe352): every BENCH.md case of Qwen3 and gpt-oss at EP = 1 with the PyTorch
# baseline (torch 2.11.0+cu130 on the device) and the plots (-c-layer-{qwen3,gpt-oss}.{json,log,
# png}, -c-torch-*.json, -c-quantize.json). nvfp4 1 / 128 / 4096 tokens: Qwen3 26.2 / 155.4 /
# 804.1, gpt-oss 40.5 / 479.1 / 1722.8; PyTorch 354.1 / 686.5 / 2208.3 and 350.8 / 2411.4 /
# 4335.4.
export MOE_EP_COMMIT=b3fe352; export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 280 cmake --build build-gpu -j 16 --target bench_layer bench_quantize > $OUT/build.log 2>&1; BENCH_SHAPES="qwen3 gpt-oss" BENCH_EP="" TORCH_SHAPES="qwen3 gpt-oss" timeout 280 scripts/gpu_round.sh benchall 2>&1 | tail -50
# Call D (main b3fe352): decode knobs at small token counts (-d-decode-knobs-{qwen3,gpt-oss}-
# ab.log; default / MOE_EP_DECODE_SPLITK=2 / =4,2 / MOE_EP_DECODE_CPS=2,2, two runs each) and
# the timeline build (-d-timeline-gpt-oss.log; Qwen3's lines are in the call's printed output:
# mxfp4_mxfp8 1 token prepare 0.0..1.2, fc1 0.8..12.1, fc2 2.6..18.2, finalize 14.2..20.1 us,
# replay 23.7). Qwen3 nvfp4 1 / 2 / 4 / 8 tokens: default 26.2, 25.8 / 33.0, 33.5 / 42.7, 43.0
# / 68.7, 67.7; split 2: 27.5, 27.6 / 35.6, 35.8 / 52.5, 52.3 / 82.3, 81.7; 4,2: 26.0, 25.9 /
# 38.5, 38.1 / 55.2, 55.6 / 92.1, 92.4; 2-chunk slots: 25.2, 25.7 / 30.7, 31.2 / 40.9, 41.3 /
# 66.0, 66.4 (mxfp4_mxfp8 with them: 23.2, 23.3 / 29.1, 29.3 / 38.8, 38.7 / 61.9, 62.1 against
# 22.9, 22.8 / 30.3, 30.8 / 39.0, 39.1 / 60.2, 60.4). gpt-oss nvfp4 1 / 2 / 4: default 40.6,
# 40.6 / 52.6, 52.9 / 79.2, 78.4; split 2 40.5, 41.2 / 56.6, 56.7 / 93.5, 93.0; 4,2 43.5, 43.2
# / 61.3, 61.4 / 104.1, 105.4; 2-chunk slots 40.1, 40.2 / 51.7, 51.7 / 80.5, 80.5.
export MOE_EP_COMMIT=b3fe352; export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cfg() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include $2 > $OUT/cfg_$1.log 2>&1 && cmake --build $1 -j 8 --target bench_layer > $OUT/build_$1.log 2>&1; echo "$1 rc=$?"; }; cfg build-gpu "" & cfg build-timeline -DMOE_EP_TIMELINE=ON & wait; V="this;this:MOE_EP_DECODE_SPLITK=2;this:MOE_EP_DECODE_SPLITK=4,2;this:MOE_EP_DECODE_CPS=2,2"; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape qwen3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,4,8" timeout 200 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_qwen3.log; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape gpt-oss --recipes nvfp4 --routing uniform --tokens 1,2,4" timeout 120 scripts/gpu_round.sh ab > /dev/null; TIMELINE_ARGS="--shape qwen3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,8" timeout 100 scripts/gpu_round.sh timeline > /dev/null; cp $OUT/timeline.log $OUT/tl_qwen3.log; TIMELINE_ARGS="--shape gpt-oss --recipes nvfp4 --routing uniform --tokens 1,4" timeout 60 scripts/gpu_round.sh timeline > /dev/null; cat $OUT/tl_qwen3.log $OUT/timeline.log
# Call E (branch s30-decode-groups 46d2dca: two consumer groups in the tile-8 decode kernel,
# default where a grid holds one CTA per SM, and one fragment per consumer warp as a knob).
# GPU tests 37/38 (-e-groups-gpu-tests.log): GraphReplayWithNumTokens fails for mxfp4_bf16 at
# n = 1 (the eager grouped forward sums K in another order than the graph's m64 kernel);
# DecodeGroupsAgainstCpu passes (nvfp4 bitwise, mxfp4_bf16 up to 1.0e-4). With
# MOE_EP_DECODE_FW=1 every decode test passes. A/B (-e-groups-fw1-*-ab.log; groups off /
# groups policy / one fragment per warp forced on both GEMMs): Qwen3 nvfp4 1 token 25.6, 25.7 /
# 24.0, 24.3 / 23.1, 23.1, 2 tokens 33.9, 33.6 / 34.0, 34.1 / 29.9, 30.5, 4 tokens level;
# Qwen3 mxfp4_mxfp8 1 token 23.0, 22.9 / 20.8, 21.2 / 23.2, 23.6, 4 tokens 38.9, 38.7 / 38.7,
# 38.8 / 40.4, 40.3; gpt-oss nvfp4 1 / 2 / 4: 40.2, 39.9 / 40.4, 40.2 / 37.7, 38.1; 53.0, 52.4 /
# 52.6, 52.8 / 51.3, 51.2; 78.8, 78.9 / 78.8, 78.6 / 83.2, 82.9; gpt-oss mxfp4_mxfp8 1 / 2 / 4:
# 36.8, 36.6 / 35.6, 35.5 / 39.0, 39.1; 48.6, 48.5 / 48.4, 48.4 / 52.1, 51.9; 75.7, 75.7 / 76.0,
# 76.0 / 85.2, 85.1; DSV3 nvfp4 1 token 72.1, 71.9 / 72.1, 72.2 / 71.6, 71.9.
export MOE_EP_COMMIT=46d2dca; export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 240 cmake --build build-gpu -j 16 --target moe_ep_gpu_tests bench_layer > $OUT/build.log 2>&1; timeout 150 build-gpu/tests/moe_ep_gpu_tests > $OUT/gpu_tests.log 2>&1; MOE_EP_DECODE_FW=1 timeout 90 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Qwen3*:GpuLayer.GptOss*:GpuLayer.Decode*:GpuLayer.GraphReplay*:GpuLayer.Edge*:GpuLayer.Unfinalized*' > $OUT/fw1_tests.log 2>&1; V="this:MOE_EP_DECODE_GROUPS=1;this;this:MOE_EP_DECODE_GROUPS=1 MOE_EP_DECODE_FW=1"; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape qwen3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,4" timeout 100 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_qwen3.log; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape gpt-oss --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,4" timeout 100 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_gptoss.log; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 1" timeout 80 scripts/gpu_round.sh ab > /dev/null
# Call F (main 5058773: one fragment per consumer warp for nvfp4 where a GEMM's grid holds one
# CTA per SM; ab_base = b3fe352): GPU tests 37/37 (the fp8 hashes unchanged), memcheck 0 errors,
# racecheck 0 hazards. A/B (-f-fw1-policy-*-ab.log), base first: Qwen3 nvfp4 1 token 26.4 /
# 25.8 -> 23.6 / 22.9, 2 tokens 33.4 / 33.7 -> 33.4 / 33.3, 8 tokens 69.3 / 68.9 -> 69.0 / 68.4;
# Qwen3 mxfp4_mxfp8 1 / 2 / 8 unchanged (23.1 / 22.9 -> 23.1 / 23.3, ...); gpt-oss nvfp4 1 token
# uniform 41.2 / 41.5 -> 39.1 / 39.3, Zipf 41.4 / 41.6 -> 39.5 / 39.5, 2 tokens level; DSV3 nvfp4
# 1 token 72.6 / 72.3 -> 72.6 / 72.6, 8 tokens 379.8 / 379.3 -> 379.0 / 379.0.
export MOE_EP_COMMIT=5058773; export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg_$2.log 2>&1 && cmake --build $2 -j $3 $4 > $OUT/build_$2.log 2>&1; echo "$2 rc=$?"; }; cfg . build-gpu 13 "--target moe_ep_gpu_tests bench_layer" & cfg ab_base build-ab-base 3 "--target bench_layer" & wait; timeout 150 build-gpu/tests/moe_ep_gpu_tests > $OUT/gpu_tests.log 2>&1; timeout 100 scripts/gpu_round.sh sanitize 2>&1 | tail -2; V="base;this"; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape qwen3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,8" timeout 100 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_qwen3.log; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape gpt-oss --recipes nvfp4 --routing both --tokens 1,2" timeout 80 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_gptoss.log; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8" timeout 80 scripts/gpu_round.sh ab > /dev/null
# Call G (main 2668294, the kernels of 5058773): the moe-ep command on the GPU (-g-cli.log):
# `moe-ep run` (tiny shape, every recipe, 64 tokens) and `moe-ep check --tokens 0,1,7,128`, 16
# PASS, nvfp4 and mxfp4_mxfp8 bitwise equal to the CPU reference.
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 240 cmake --build build-gpu -j 16 --target moe-ep > $OUT/build.log 2>&1; timeout 120 scripts/gpu_round.sh cli
# Call H (main f619d0e: bench_layer's records name the decode's fragments per consumer warp):
# -h-qwen3-records.{json,log}: nvfp4 1 token [1, 1] (23.4 us), 2 tokens [2, 2], 4096 null;
# mxfp4_mxfp8 [2, 2]. Then one run each with MOE_EP_DECODE_FW unset (0) and =1 at 2 and 3
# tokens (the policy's 2 CTAs per SM), nvfp4, printed output only: Qwen3 33.0 -> 30.0, 39.1 ->
# 37.4; gpt-oss 53.0 -> 52.0, 73.3 -> 74.3.
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 200 cmake --build build-gpu -j 16 --target bench_layer > $OUT/build.log 2>&1; MOE_EP_COMMIT=f619d0e timeout 30 build-gpu/bench/bench_layer --shape qwen3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,4096 --json $OUT/q.json > $OUT/q.log 2>&1; for fw in 0 1; do for sh in "qwen3 2,3" "gpt-oss 2,3"; do set -- $sh; MOE_EP_DECODE_FW=$fw timeout 30 build-gpu/bench/bench_layer --shape $1 --recipes nvfp4 --routing uniform --tokens $2 2>&1 | grep -E "^(qwen3|gpt-oss) " | sed "s/^/fw=$fw /"; done; done
