#!/usr/bin/env bash
# Session 29's device calls (nvidia-h200, the only kind lent), in order; carry [".deps"] (and
# "ab_base" where an A/B builds another revision: scripts/ab_base.sh REV first).
# Call A (main 1519ccb, session 28's review, first run on a GPU; ab_base = branch
# s28-fp8-overlap e11ac12): GPU tests 36/36; the 11 hashes of GpuLayer.Fp8PathMxfp4Mxfp8 equal
# session 28's (dsv3 T=1 b3060afdcec701e7 ... qwen3 T=400 167e1e4b31ce4d76);
# Fp8PersistentGridSameBits rel L2 3.634e-3 (Zipf ids from random_inputs), graph replays equal
# eager. A/B (-a-fp8-overlap2-{qwen3,dsv3}-ab.log; base = e11ac12, this = main; MOE_EP_FP8=1,
# medians of 20 replays, us): Qwen3 2048 398.6 / 399.3 vs 392.6 / 393.1, 4096 749.4 / 749.8 vs
# 739.2 / 737.4; DSV3 2048 3370.0 / 3364.4 vs 3132.6 / 3105.5, 4096 4713.5 / 4732.2 vs 4629.5 /
# 4640.3. e11ac12 not kept.
export MOE_EP_COMMIT=1519ccb; export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg_$2.log 2>&1 && cmake --build $2 -j $3 $4 > $OUT/build_$2.log 2>&1; echo "$2 rc=$?"; }; cfg . build-gpu 13 "" & cfg ab_base build-ab-base 3 "--target bench_layer" & wait; tail -3 $OUT/build_build-gpu.log; timeout 240 build-gpu/tests/moe_ep_gpu_tests > $OUT/gpu_tests.log 2>&1; echo tests rc=$?; grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tests ran" $OUT/gpu_tests.log | head; grep -E "fp8-vs-cpu|fp8-pers|hash" $OUT/gpu_tests.log | head -30; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 100 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_qwen3.log; AB_REPS=2 AB_VARIANTS="base:MOE_EP_FP8=1;this:MOE_EP_FP8=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 150 scripts/gpu_round.sh ab >/dev/null; cat $OUT/ab_qwen3.log $OUT/ab.log | grep -v "^#.*clocks" | head -60
# Call B (branch s29-fp8-promote 873f317: MOE_EP_FP8_PROMOTE=fc1,fc2 k32 steps per fp32
# promotion; Fp8EveryNClassSameBits also runs the default path on the same inputs): every value
# in -b-fp8-promote-errors.txt (max / median / rms over 34 one-slot token counts: 4,4 6.19e-3 /
# 2.24e-3 / 2.86e-3; 2,4 3.44e-3 / 1.97e-3 / 2.05e-3; 1,4 5.93e-3 / 1.33e-3 / 1.85e-3; 4,1
# 6.18e-3 / 2.20e-3 / 2.83e-3; 1,1 5.92e-3 / 1.24e-3 / 1.78e-3; default path <= 6.0e-5); the 11
# hashes unchanged with 4,4; DSV3 4096 tokens (-b-fp8-promote-dsv3.log, one run each) 4,4
# 4495.7 us, 2,4 4811.1, 1,4 5525.5, 2,2 4998.9.
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 330 cmake --build build-gpu -j 16 --target moe_ep_gpu_tests bench_layer > $OUT/build.log 2>&1; echo build rc=$?; for P in 4,4 2,4 1,4 4,1 1,1; do F='GpuLayer.Fp8EveryNClassSameBits'; [ $P = 4,4 ] && F="$F:GpuLayer.Fp8PathMxfp4Mxfp8"; MOE_EP_FP8_PROMOTE=$P timeout 80 build-gpu/tests/moe_ep_gpu_tests --gtest_filter=$F > $OUT/t_$P.log 2>&1; echo "== P=$P rc=$? $(grep -cE 'OK \]' $OUT/t_$P.log) ok"; grep -E "one-expert|fp8-vs-cpu|Failure" $OUT/t_$P.log | awk '{printf "%s | ", $0} END {print ""}' | sed 's/\[ fp8-one-expert \]//g; s/\[ fp8-vs-cpu \]//g' | tr -s ' '; done; AB_REPS=1 AB_VARIANTS="this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_PROMOTE=2,4;this:MOE_EP_FP8=1 MOE_EP_FP8_PROMOTE=1,4;this:MOE_EP_FP8=1 MOE_EP_FP8_PROMOTE=2,2" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 4096" timeout 120 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|dsv3 " $OUT/ab.log
# Call C (main e4e76ce: SmallForSanitizer with the fp8 path on 2 CTAs, Fp8EveryNClassSameBits
# with the default path beside it): GPU tests 36/36 (-c-gpu-tests.log), memcheck 0 errors and
# racecheck 0 hazards on SmallForSanitizer (-c-sanitize.log; racecheck 17.7 s).
export MOE_EP_COMMIT=e4e76ce; timeout 560 scripts/gpu_round.sh build test sanitize > $OUT/round.log 2>&1
# Call D (branch s29-fp8-dec cd7fb6c: MOE_EP_FP8_DEC=1, a decoder warpgroup writes e4m3 A tiles
# to shared memory, the consumers' wgmmas take both operands from shared memory): with it on,
# GpuLayer.Fp8* and SmallForSanitizer pass with the same 11 hashes and one-slot errors
# (-d-fp8-dec-tests.log); slower (-d-fp8-dec-{dsv3,qwen3}-ab.log, medians of 20 replays, us):
# DSV3 2048 3008.9 / 3013.9 -> 4385.7 / 4382.0, 4096 4534.1 / 4522.5 -> 5361.9 / 5354.8; Qwen3
# 2048 / 4096 392.8 / 737.9 -> 453.7 / 851.9. Not kept.
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 300 cmake --build build-gpu -j 16 --target moe_ep_gpu_tests bench_layer > $OUT/build.log 2>&1; echo build rc=$?; MOE_EP_FP8_DEC=1 timeout 90 build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Fp8*:GpuLayer.SmallForSanitizer' > $OUT/dec_tests.log 2>&1; rc=$?; echo "dec tests rc=$rc"; [ $rc = 0 ] || exit 1; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_DEC=1" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 150 scripts/gpu_round.sh ab > /dev/null; cp $OUT/ab.log $OUT/ab_dsv3.log; AB_REPS=1 AB_VARIANTS="this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_DEC=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 60 scripts/gpu_round.sh ab > /dev/null
# Call E (branch s29-fp8-dec cd7fb6c): Nsight Compute of the decoder variant's fc1, DSV3 2048
# tokens (-e-ncu-fp8-dec-2048.txt, per-instruction samples in -e-ncu-fp8-dec-2048_sass.csv.gz):
# 2.83 ms, 0.46 issued per scheduler; by role, consumers 51 % long scoreboard (waiting for the
# decoded tiles), decoder warps selected 21.6 % (busy), producers 65 % long scoreboard.
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 300 cmake --build build-gpu -j 16 --target bench_layer > $OUT/build.log 2>&1; NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); MOE_EP_FP8=1 MOE_EP_FP8_DEC=1 timeout 200 $NCU --clock-control none -k regex:fp8_ws_kernel -c 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters -o $OUT/dec build-gpu/bench/bench_layer --shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048 --iters 3 > $OUT/ncu.log 2>&1; $NCU -i $OUT/dec.ncu-rep --page details > $OUT/dec_details.txt 2>&1; $NCU -i $OUT/dec.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/dec_sass.csv.gz
# Call F (main 7a7dc0c, the default paths' kernels as in session 28): every BENCH.md case of
# DSV3 at EP = 1 in one process (-f-layer-dsv3.{json,log}, -f-quantize.json; the plot
# -f-layer-dsv3.png drawn here with the recorded PyTorch baseline
# bench/results/h200-2026-11-29-torch-baseline.json). Uniform routing, medians of 20 replays, us:
# nvfp4 1 / 128 / 4096 tokens 72.8 / 1777.2 / 6005.3; mxfp4_mxfp8 67.3 / 1890.5 / 6025.4;
# mxfp4_bf16 67.3 / 1695.8 / 5922.2; bf16 183.6 / 5019.4 / 10502.2.
export MOE_EP_COMMIT=7a7dc0c; timeout 200 scripts/gpu_round.sh build > $OUT/build_step.log 2>&1; BENCH_SHAPES="dsv3" BENCH_EP="" TORCH_SHAPES="" timeout 330 scripts/gpu_round.sh benchall
# Call G (main 37adc5d): the fp8 path's MMA width lists on Qwen3 with the persistent kernel
# (-g-fp8-qwen3-widths-ab.log; MOE_EP_FP8=1, medians of 20 replays, two runs, us): the policy
# (coarse list for Qwen3's GEMMs) 1024 / 2048 / 4096 tokens 276.8, 276.9 / 393.9, 392.8 / 740.5,
# 739.7; the fine list forced (MOE_EP_FP8_FINE_N=1) 284.9, 284.4 / 449.8, 450.3 / 811.4, 811.0.
# The policy stands.
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 240 cmake --build build-gpu -j 16 --target bench_layer > $OUT/build.log 2>&1; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=1" AB_ARGS="--shape qwen3 --recipes mxfp4_mxfp8 --routing uniform --tokens 1024,2048,4096" timeout 150 scripts/gpu_round.sh ab
# Call H (main b4f5618): the same on DSV3 (-h-fp8-dsv3-widths-ab.log; two runs, us): the policy
# (fine list) 2048 / 4096 tokens 3150.8, 3126.8 / 4643.1, 4646.8; the coarse list forced
# (MOE_EP_FP8_FINE_N=0) 3305.5, 3328.4 / 4625.7, 4611.6. The policy stands (-5 % at 2048, level
# at 4096 under the power cap).
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null); cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_EP_CUDA=ON ${NCCL_DIR:+-DNCCL_ROOT=$NCCL_DIR} -DGTEST_ROOT=$PWD/.deps/gtest -DCUTLASS_DIR=$PWD/.deps/cutlass/include > $OUT/cfg.log 2>&1 && timeout 200 cmake --build build-gpu -j 16 --target bench_layer > $OUT/build.log 2>&1; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FP8=1;this:MOE_EP_FP8=1 MOE_EP_FP8_FINE_N=0" AB_ARGS="--shape dsv3 --recipes mxfp4_mxfp8 --routing uniform --tokens 2048,4096" timeout 140 scripts/gpu_round.sh ab
