#!/usr/bin/env bash
# Session 31's device calls, in order; carry [".deps"]. nvidia-h200 unless marked; all timings
# medians of 20 CUDA-graph replays, uniform routing, us. "cfg" below stands for
#   export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])"); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON -DNCCL_ROOT=$NCCL_DIR -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log && cmake --build build-gpu -j 16 --target bench_layer moe_ep_gpu_tests > $OUT/build.log
#
# Call A (main e5479e6 = 17ce578 + bench_layer --hidden/--inter): GPU tests 37/37 (-a-gpu_tests.log).
# The probe (-a-probe-h10752.log): DSV3 with H = 10752 has fc1 bytes equal to DSV3's fc1 + fc2
# (198 MB at 1 token); its eager fc1 stage 60.1-60.5 us against DSV3's fc1 45.6-45.7 + fc2
# 27.0-27.1 (nvfp4, 1 token): the bound on what one launch streaming both could save.
cfg; build-gpu/tests/moe_ep_gpu_tests; for r in 1 2; do for h in 0 10752; do a=""; [ $h -gt 0 ] && a="--hidden $h"; build-gpu/bench/bench_layer --shape dsv3 $a --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2; done; done
# Call B (branch s31-fold-fc2 cf4cb23, fc2 folded into fc1): FoldFc2IntoFc1 failed only its
# 1e-5 bound between folded and unfolded mxfp4 outputs (2.2e-5 .. 1.4e-4: y's bf16 roundings
# flip); within 5e-3 of the CPU, nvfp4 bitwise. No log kept (the bound became 1e-3).
# Call C (s31-fold-fc2 0d7fdee): FoldFc2IntoFc1 passes; A/B MOE_EP_FOLD_FC2=0 / 1
# (-c-fold-{dsv3,qwen3}-ab.log): DSV3 nvfp4 1 token 72.4 / 72.3 -> 84.2 / 84.2, mxfp4_mxfp8
# 67.2 / 67.2 -> 76.9 / 76.6 (fused fc1 eager 66.8, reduce 13.1); 2-4 tokens 14-17 % slower.
cfg; build-gpu/tests/moe_ep_gpu_tests --gtest_filter=GpuLayer.FoldFc2IntoFc1; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FOLD_FC2=0;this:MOE_EP_FOLD_FC2=1" AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,3,4" scripts/gpu_round.sh ab; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FOLD_FC2=0;this:MOE_EP_FOLD_FC2=1" AB_ARGS="--shape qwen3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,4,8" scripts/gpu_round.sh ab
# Call D (s31-fold-fc2 1c4473b: h slice as shared-memory B rows, the reduce over 8 warps):
# FoldFc2IntoFc1 + SmallForSanitizer pass; (-d-fold2-*-ab.log) DSV3 1 token nvfp4 73.0 / 72.8
# -> 74.8 / 74.6, mxfp4_mxfp8 67.9 / 67.8 -> 67.5 / 67.1 (fused fc1 eager 65.3-66.3, reduce
# 6.4); 2-3 tokens 7-11 % slower; Qwen3 1 token level, 2 tokens +9 %.
cfg; build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.FoldFc2IntoFc1:GpuLayer.SmallForSanitizer'; (the A/Bs of call C at tokens 1,2,3 / qwen3 nvfp4 1,2,4)
# Call E (s31-fold-fc2 d097412 + MOE_EP_WEIGHT_EVICT_FIRST, four variants, -e-fold-evict-*-ab.log):
# DSV3 nvfp4 1 token: plain 73.7 / 72.4, fold 75.6 / 75.0, evict_first 70.7 / 70.6, fold +
# evict_first 69.3 / 68.9; Qwen3 nvfp4 8 tokens plain 72.4 / 72.3, evict_first 64.5 / 64.7.
cfg; V="this:MOE_EP_FOLD_FC2=0;this:MOE_EP_FOLD_FC2=1;this:MOE_EP_FOLD_FC2=0 MOE_EP_WEIGHT_EVICT_FIRST=1;this:MOE_EP_FOLD_FC2=1 MOE_EP_WEIGHT_EVICT_FIRST=1"; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,8,128" scripts/gpu_round.sh ab; AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape qwen3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,8" scripts/gpu_round.sh ab
# Call F (main eaa7540, evict_first on by default): GPU tests 38/38, memcheck 0 errors,
# racecheck 0 hazards (-f-*.log); A/B default against MOE_EP_WEIGHT_EVICT_FIRST=0
# (-f-evict-dsv3-ab.log; the power cap was active in most samples of these runs).
cfg; build-gpu/tests/moe_ep_gpu_tests; scripts/gpu_round.sh sanitize; AB_REPS=2 AB_VARIANTS="this:MOE_EP_WEIGHT_EVICT_FIRST=0;this" AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing uniform --tokens 1,2,4,8,32,128" scripts/gpu_round.sh ab
# Call G (main eaa7540, the same machine): Qwen3 and gpt-oss (-g-evict-*-ab.log), and the m64
# kernel's knob MOE_EP_M64_EVICT_FIRST=1 (-g-m64-evict-*-ab.log: DSV3 512 / 2048 within the
# runs' spread, Qwen3 512 244.8 / 245.8 -> 241.2 / 239.9, 2048 level; stays off).
for sh in qwen3 gpt-oss; do AB_REPS=2 AB_VARIANTS="this:MOE_EP_WEIGHT_EVICT_FIRST=0;this" AB_ARGS="--shape $sh --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,8,32,128" scripts/gpu_round.sh ab; done; for sh in dsv3 qwen3; do AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_M64_EVICT_FIRST=1" AB_ARGS="--shape $sh --recipes nvfp4 --routing uniform --tokens 512,2048" scripts/gpu_round.sh ab; done
# Call H (nvidia-h200-x2, main eaa7540): the multi-GPU suite 27/27
# (h200x2-2026-12-01-s31-h-multigpu_tests.log); EP = 2 A/B (h200x2-...-s31-h-evict-ep2-ab.log):
# DSV3 nvfp4 per rank 1 / 8 / 128 tokens 105.2 / 105.5, 382.7 / 383.9, 927.5 / 926.2 with
# evict_normal; 103.8 / 104.1, 379.6 / 378.8, 911.5 / 911.3 with evict_first (the default).
scripts/gpu_round.sh build multigpu; AB_REPS=2 AB_VARIANTS="this:MOE_EP_WEIGHT_EVICT_FIRST=0;this" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8,128" scripts/gpu_round.sh ab
# Call I (main 4e534df, the review: the m64 evict_first knob removed): GPU tests 38/38
# (-i-review-gpu_tests.log), memcheck 0 errors, racecheck 0 hazards.
cfg; build-gpu/tests/moe_ep_gpu_tests; scripts/gpu_round.sh sanitize
