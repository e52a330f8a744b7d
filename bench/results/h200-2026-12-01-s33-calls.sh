#!/usr/bin/env bash
# Session 33's device calls, in order; nvidia-h200 (the only kind lent). The binaries were built
# on the development machine (nvcc 13.0.88, the same NCCL 2.28.9 headers) and carried as one
# xz archive (`tar -cf - tests/moe_ep_gpu_tests bench/bench_layer bench/bench_quantize moe-ep |
# xz -9 > build-carry/bins.tar.xz` from build/, 14 MB; carry ["build-carry"]), so no call
# built on the device. Timings are medians of 20 CUDA-graph replays, us, unless marked.
#
# Call A (main 92e673f, the session-32 review that had not run on a GPU): GPU tests 39/39,
# memcheck 0 errors, racecheck 0 hazards, `moe-ep run` / `check --tokens 0,1,7,128` 16 PASS
# (-a-round.log, -a-logs.tgz); every BENCH.md case of DSV3 at EP = 1 (-a-layer-dsv3.{json,log},
# the plot -a-layer-dsv3.png drawn here with the recorded PyTorch baseline
# h200-2026-11-29-torch-baseline.json). Uniform, 1 / 8 / 32 / 128 / 512 / 2048 / 4096 tokens:
# nvfp4 69.6 / 377.0 / 1104.8 / 1747.1 / 2606.6 / 4187.2 / 5933.1; mxfp4_mxfp8 65.2 / 362.3 /
# 1053.8 / 1692.3 / 2525.1 / 4039.5 / 5800.2; mxfp4_bf16 64.5 / 364.6 / 1042.6 / 1652.6 / 2553.9
# / 4194.3 / 6030.4; bf16 183.4 / 1200.5 / 3352.2 / 5026.5 / 6194.8 / 6876.4 / 10484.4.
# Zipf nvfp4 4096: 6791.7.
export NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])"); export LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}; mkdir -p build && tar -xJf build-carry/bins.tar.xz -C build && export BUILD_DIR=build MOE_EP_COMMIT=92e673f && scripts/gpu_round.sh test sanitize cli; BENCH_SHAPES=dsv3 BENCH_EP="" TORCH_SHAPES="" timeout 320 scripts/gpu_round.sh benchall
# Call B (92e673f + the new tests, committed after the call): GPU tests 43/43 in 160 s
# (-b-gpu_tests.log), with Dsv3 / Qwen3 / GptOss / MixtralAllRecipesAt4096 (every recipe at
# T = 4096 = capacity against the CPU, rel L2 nvfp4 0 - 3.6e-6, mxfp4_mxfp8 2.1e-5 - 2.2e-4,
# mxfp4_bf16 1.5e-4 - 4.0e-4, bf16 6.5e-4 - 1.4e-3; the repeated forward bitwise) and the
# capacity - 1 cases added to gpt-oss (159) and Mixtral (127, 128); every BENCH.md case of Qwen3
# and gpt-oss at EP = 1 with the PyTorch baseline (-b-layer-*.{json,log,png}, -b-torch-*).
# nvfp4 uniform 1 / 128 / 4096 tokens: Qwen3 23.5 / 140.2 / 801.9 (PyTorch 724.6 / 730.9 /
# 2262.1), gpt-oss 36.9 / 476.3 / 1744.8 (PyTorch 392.4 / 2724.8 / 4416.0).
scripts/gpu_round.sh test; BENCH_SHAPES="qwen3 gpt-oss" BENCH_EP="" scripts/gpu_round.sh benchall
# Call C (same binaries): where DSV3 nvfp4's 1-token GEMMs lose time, probed by the grid's
# CTAs per SM (-c-probe.log, two runs; eager stage times prep/fc1/fc2/fin in us). fc2 at H =
# 6272 / 6656 / 7168 / 7680 (392 / 416 / 448 / 480 CTAs of 128 rows, at most 3 / 4 / 4 / 4 per
# SM): 23.3-23.5 / 26.4-26.5 / 26.7 / 27.2. fc1 at I = 1920 / 2048 / 2112 (240 / 256 / 264 CTAs,
# at most 2 per SM): 44.0-45.2 / 44.2-45.0 / 44.8-46.4.
for h in 6272 6656 7168 7680; do build/bench/bench_layer --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1 --hidden $h; done; for i in 1920 2048 2112; do build/bench/bench_layer --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1 --inter $i; done
# Call D (same binaries): the opt-in fp8 path (MOE_EP_FP8=1, mxfp4_mxfp8) on main, records with
# mma_type fp8 (-d-fp8-{dsv3,qwen3}.{json,log}): DSV3 512 / 2048 / 4096 tokens 2394.1 / 3154.0 /
# 4545.1 (mma_fraction 0.47 at 4096), Qwen3 228.4 / 390.6 / 735.2.
for s in dsv3 qwen3; do MOE_EP_FP8=1 build/bench/bench_layer --shape $s --recipes mxfp4_mxfp8 --routing uniform --tokens 512,2048,4096 --json $OUT/d-fp8-$s.json; done
# Call E (5b10e46's scripts, the same binaries packed by scripts/pack_carry.sh): the carried
# step, GPU tests 2/2 (filtered), the multi-GPU suite skipping on one GPU, moe-ep run / check
# 16 PASS.
GTEST_FILTER='GpuLayer.SmallForSanitizer:GpuLayer.Fc1RoomForFc2SameBits' scripts/gpu_round.sh carried test multigpu cli
# Call F (the review's test mend: gpt-oss's options in one helper; Qwen3Capacity4096 runs every
# recipe through compare_shape at 4095 / 4096 instead of its own loop over two recipes, and
# replaces Qwen3AllRecipesAt4096): GPU tests 42/42 (-f-gpu_tests.log); Qwen3 at 4095 / 4096
# nvfp4 0 / 0, mxfp4_mxfp8 4.2e-5 / 2.0e-5, mxfp4_bf16 1.5e-4 / 1.6e-4, bf16 6.8e-4 / 6.5e-4.
scripts/gpu_round.sh carried test
