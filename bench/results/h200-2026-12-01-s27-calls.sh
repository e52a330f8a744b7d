#!/usr/bin/env bash
# Session 27's device calls (nvidia-h200, the only kind lent; carry [".deps"], with "ab_base" =
# scripts/ab_base.sh main (216c335) from call B on), in order. Branch s27-fp8: the fp8 path's
# loop variants behind knobs (MOE_EP_FP8_SPLIT, MOE_EP_FP8_ORDER, MOE_EP_FP8_FINE_N), then the
# kept change (the fine MMA widths where a GEMM has >= 32 M-tiles). Every run MOE_EP_FP8=1, DSV3
# mxfp4_mxfp8 uniform unless named, medians of 20 graph replays.
# Call A (dc03626): the fp8 tests under each knob give the same 11 output hashes
# (-a-fp8-variant-tests.log); A/B of the knobs (-a-fp8-variants-ab.log): the build's default
# 4924-4928 us at 4096 tokens, SPLIT 4764-4783, ORDER 4810-4892, FINE_N 4811-4818, SPLIT+FINE_N
# 4751-4770.
export MOE_EP_COMMIT=dc03626; timeout 240 scripts/gpu_round.sh build > $OUT/b.log 2>&1; tail -2 $OUT/b.log; T=build-gpu/tests/moe_ep_gpu_tests; for v in "" "MOE_EP_FP8_SPLIT=1" "MOE_EP_FP8_ORDER=1" "MOE_EP_FP8_FINE_N=1" "MOE_EP_FP8_SPLIT=1 MOE_EP_FP8_FINE_N=1"; do echo "# test ${v:-default}"; env $v timeout 90 $T --gtest_filter='GpuLayer.Fp8*' > $OUT/t.log 2>&1; echo "rc=$?"; grep -E "fp8-vs-cpu|FAILED|Failure" $OUT/t.log | head -14; done 2>&1 | tee $OUT/fp8_tests.log; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_SPLIT=1;this:MOE_EP_FP8=1 MOE_EP_FP8_ORDER=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=1;this:MOE_EP_FP8=1 MOE_EP_FP8_SPLIT=1 MOE_EP_FP8_FINE_N=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 330 scripts/gpu_round.sh ab 2>&1 | grep -v '^name\|^NVIDIA\|^shape'
# The two builds of one call (calls B-F): cfg DIR BUILD JOBS TARGETS.
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg_$2.log 2>&1 && cmake --build $2 -j $3 $4 > $OUT/build_$2.log 2>&1; echo "$2 rc=$?"; }
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null)
# Call B (dc03626 against main): the build's default path 3.9 % slower than main's at 4096 tokens
# (4875-4920 against 4705-4713), SPLIT+FINE_N 4732-4749 (-b-fp8-base-ab.log). Cause: the ordered
# issue's checks and the per-wgmma fences added ~9 instructions per stage to a loop that issues
# ~600 per scheduler and stage.
cfg . build-gpu 8 "--target bench_layer" & cfg ab_base build-ab-base 8 "--target bench_layer" & wait; AB_REPS=3 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_SPLIT=1 MOE_EP_FP8_FINE_N=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 400 scripts/gpu_round.sh ab
# Call C (6c268ff: no ordered issue, one fence per wgmma group, ring positions tracked): main
# 4755-4757 at 4096 tokens, this 4804-4817, FINE_N 4624-4643, SPLIT 4770-4797, SPLIT+FINE_N
# 4697-4698; 2048 tokens main 3290-3421, FINE_N 3131-3144 (-c-fp8-lean-ab.log). Same hashes.
cfg . build-gpu 8 "--target bench_layer moe_ep_gpu_tests" & cfg ab_base build-ab-base 8 bench_layer & wait; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=1;this:MOE_EP_FP8=1 MOE_EP_FP8_SPLIT=1;this:MOE_EP_FP8=1 MOE_EP_FP8_SPLIT=1 MOE_EP_FP8_FINE_N=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 400 scripts/gpu_round.sh ab
# Call D (9c82460: the fine widths by default, the split loop removed, Fp8EveryNClassSameBits):
# GpuLayer 28/29, the new test's CPU bound failed at T = 81 / 128 (5.6e-3 / 6.2e-3 on one-slot
# inputs, the same bits with either width list: the fp8 path's own error), memcheck 0 errors
# (-d-gpu-tests.log, -d-fp8-memcheck.txt); A/B (-d-fp8-fine-ab.log): 4096 tokens main 4774, this
# 4653-4675, coarse 4730-4752; 2048 main 3405-3406, this 3244-3264.
cfg . build-gpu 12 "" & cfg ab_base build-ab-base 4 "--target bench_layer" & wait; GTEST_FILTER='GpuLayer*' timeout 200 scripts/gpu_round.sh test; timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Fp8EveryNClassSameBits'; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=0" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 512,2048,4096" timeout 300 scripts/gpu_round.sh ab
# Call E (40c6260: the test's CPU bound 1e-2, fc1's producer copies dead rows in full): GpuLayer
# 29/29 with the one-slot errors printed (-e-gpu-tests.log), memcheck on GpuLayer.Fp8* 0 errors;
# DSV3 (-e-fp8-dsv3-ab.log) 4096 main 4671-4702 this 4543-4565, 2048 3293-3313 / 3128-3156, 512
# 2456-2473 / 2430-2434; Qwen3 (-e-fp8-qwen3-ab.log, one run) slower: 4096 825 -> 874, 2048 434 -> 459.
cfg . build-gpu 12 "" & cfg ab_base build-ab-base 4 "--target bench_layer" & wait; GTEST_FILTER='GpuLayer*' timeout 200 scripts/gpu_round.sh test; timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Fp8*'; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 512,2048,4096" timeout 200 scripts/gpu_round.sh ab; AB_REPS=1 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 100 scripts/gpu_round.sh ab
# Call F (49b2590: the fine list only for GEMMs of >= 32 M-tiles): fp8 tests 3/3, same hashes;
# Qwen3 (-f-fp8-qwen3-policy-ab.log) main 436.0 / 832.6-832.8, this 434.7-434.8 / 825.4-827.4,
# FINE_N=1 465.0-466.5 / 882.3-883.5 at 2048 / 4096 tokens; DSV3 (-f-fp8-dsv3-policy-ab.log)
# main 3295-3297 / 4661-4663, this 3138-3147 / 4522-4572.
cfg . build-gpu 12 "--target bench_layer moe_ep_gpu_tests" & cfg ab_base build-ab-base 4 "--target bench_layer" & wait; timeout 100 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Fp8*:GpuLayerHost.Fp8*'; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 150 scripts/gpu_round.sh ab; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 150 scripts/gpu_round.sh ab
# Call G (main 9bba690, the merge): GPU tests 34/34 (-g-gpu-tests.log), the moe-ep command on
# the GPU all PASS, Python 58 passed, 2 skipped.
export MOE_EP_COMMIT=9bba690; timeout 560 scripts/gpu_round.sh build test cli python; scripts/gpu_round.sh pack
# Call H (branch s27-fp8-shared-epi 3f9f46d, not merged: one epilogue for every width, the
# producer and consumer dispatched separately, fc1's code 40.9k -> 22.1k instructions; ab_base =
# main 2a45f92): fp8 tests 3/3, same hashes; Qwen3 (-h-shared-epilogue-qwen3-ab.log) main
# 435.5-436.4 / 826.8-828.8, this 446.8-447.0 / 835.9-837.0, this with FINE_N=1 451.4-452.5 /
# 860.7-861.5 at 2048 / 4096 tokens; DSV3 (-h-shared-epilogue-dsv3-ab.log) main 3150.5-3158.2 /
# 4459.7-4488.9, this 3132.4-3150.5 / 4410.8-4439.1 (fc1 2692-2696 -> 2610).
cfg . build-gpu 12 "--target bench_layer moe_ep_gpu_tests" & cfg ab_base build-ab-base 4 "--target bench_layer" & wait; timeout 100 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Fp8*:GpuLayerHost.Fp8*'; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 150 scripts/gpu_round.sh ab; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 150 scripts/gpu_round.sh ab
# Call I (main b67e1f9): Nsight Compute of the fp8 kernels at DSV3 4096 tokens
# (-i-ncu-fp8-4096.txt): fc1 2.69 ms, 0.46 issued per scheduler and cycle, 0.70 eligible of 2.74
# active warps, 5.97 cycles per issued instruction; fc2 1.48 ms, 0.44 / 0.63 / 2.61 / 5.98.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && cmake --build build-gpu -j 16 --target bench_layer > $OUT/build.log 2>&1; NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); MOE_EP_FP8=1 timeout 300 $NCU --clock-control none -k regex:sm90_moe_fp8 -c 2 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats -o $OUT/ncu_fp8_4096 build-gpu/bench/bench_layer --shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 4096 --iters 3; $NCU -i $OUT/ncu_fp8_4096.ncu-rep --page details > $OUT/ncu_fp8_4096.txt
# Call J (main 4a21f72): the fp8 kernels' stall reasons per issued instruction at DSV3 4096 tokens
# (-j-ncu-fp8-stalls.txt): fc1 wait 1.34, selected 1.00, long scoreboard 0.93, short scoreboard
# 0.60, not selected 0.52, dispatch 0.42, math pipe throttle 0.31, no instruction 0.22, branch
# 0.19, barrier 0.12, gmma 0.12; fc2 alike (wait 1.49, long scoreboard 0.91, barrier 0.28).
MOE_EP_FP8=1 timeout 150 $NCU --clock-control none -k regex:sm90_moe_fp8 -c 2 --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,smsp__inst_executed.sum,smsp__cycles_active.avg -o $OUT/ncu_stall build-gpu/bench/bench_layer --shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 4096 --iters 1; $NCU -i $OUT/ncu_stall.ncu-rep --page raw --csv > $OUT/ncu_stall.csv
