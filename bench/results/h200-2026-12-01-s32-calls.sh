#!/usr/bin/env bash
# Session 32's device calls, in order; carry [".deps"]; nvidia-h200 (the only kind lent).
# Timings are medians of 20 CUDA-graph replays, us, unless marked.
#
# Call A (main 392c542): every BENCH.md case of DSV3 at EP = 1 in one process
# (-a-layer-dsv3.{json,log}, -a-quantize.json; the plot -a-layer-dsv3.png drawn here with the
# recorded PyTorch baseline bench/results/h200-2026-11-29-torch-baseline.json). Uniform:
# nvfp4 1 / 8 / 32 / 128 / 512 / 2048 / 4096 tokens 70.5 / 377.0 / 1050.6 / 1745.3 / 2603.6 /
# 4197.2 / 5914.5; mxfp4_mxfp8 65.5 / 362.2 / 990.8 / 1693.4 / 2493.8 / 4035.4 / 5851.6;
# mxfp4_bf16 66.8 / 368.6 / 1016.4 / 1704.0 / 2518.9 / 4092.7 / 5974.7; bf16 185.0 / 1174.2 /
# 3370.9 / 5018.7 / 6200.6 / 6878.1 / 10507.0.
export MOE_EP_COMMIT=392c542; timeout 230 scripts/gpu_round.sh build > $OUT/build_step.log 2>&1; BENCH_SHAPES="dsv3" BENCH_EP="" TORCH_SHAPES="" timeout 340 scripts/gpu_round.sh benchall
# Call B (same machine): one-fragment consumer warps forced on both decode GEMMs
# (MOE_EP_DECODE_FW=1) against the policy (-b-fw-{qwen3,dsv3,gptoss}-ab.log), nvfp4 uniform, two
# runs each: Qwen3 2 / 3 / 4 / 5 / 6 / 8 / 12 tokens 31.2-31.3 / 36.6-37.2 / 41.5 / 49.7-50.3 /
# 50.3-50.8 / 63.8-63.9 / 76.6-77.7 -> 29.2 / 35.2-35.3 / 40.7-40.8 / 50.1-50.3 / 53.3-54.0 /
# 60.7 / 77.0-77.1 (1 token takes them by the policy already); DSV3 1 / 2 / 3 / 4 tokens
# 70.0-70.3 / 116.5-117.1 / 160.3-161.3 / 211.5-212.2 -> 70.2-70.6 / 124.5-125.0 / 171.3-171.7 /
# 227.1-227.8; gpt-oss 2 / 3 tokens 50.7-50.8 / 70.0-70.2 -> 49.8-50.2 / 72.5-73.2.
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_FW=1" AB_ARGS="--shape qwen3 --recipes nvfp4 --routing uniform --tokens 1,2,3,4,5,6,8,12" scripts/gpu_round.sh ab  # then dsv3 --tokens 1,2,3,4 and gpt-oss --tokens 2,3
# Call C (fresh machine, main 392c542): Nsight Compute counters of the decode GEMMs under
# evict_first and evict_normal (-c-ncu-evict-dsv3-{1,8}-evict_first{0,1}.csv; the Qwen3 CSVs of
# this call did not come back (more than 8 files), and a rerun on the warm machine split the
# cases wrongly, so call D repeats them). DSV3 1 token, three forwards each: fc1 43.6-44.1 ->
# 42.9-43.5 us, fc2 26.2-26.6 -> 25.9-26.1; DRAM reads = the weights (132.2 / 66.2 MB); L2 read
# sectors 1.52x the DRAM bytes; L2 hit rate 1.6-2.9 % either way. DSV3 8 tokens level.
timeout 230 scripts/gpu_round.sh build; NCU_CASES="dsv3 1;dsv3 8" scripts/ncu_evict_probe.sh
# Call D (fresh machine, main 392c542 + scripts/ncu_evict_probe.sh): the Qwen3 cases
# (-d-ncu-evict.tgz) and Nsight Compute of the m64 GEMMs at DSV3 nvfp4 4096 tokens, uniform
# against Zipf (-d-ncu-m64-4096.tgz). Qwen3 8 / 32 / 128 tokens: the isolated kernels take the same
# time under both policies (e.g. 8 tokens fc1 46.3-47.2 against 46.3-46.8 us). m64: fc1 3.38 ms
# uniform, 4.09 Zipf; fc2 1.73 / 2.14; DRAM reads 4.69 / 4.81 GB (fc1) and 2.25 / 2.25 (fc2);
# wgmma instructions 29.4 M / 42.9 M (fc1) and 14.7 M / 21.4 M (fc2); all instructions 1.43 G /
# 1.92 G (fc1).
timeout 230 scripts/gpu_round.sh build; NCU_CASES="qwen3 8;qwen3 32;qwen3 128" scripts/ncu_evict_probe.sh; for r in uniform zipf; do ncu --clock-control none -k regex:sm90_moe_wgmma3 -c 2 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_op_read.sum,lts__t_sectors_op_read_lookup_hit.sum,sm__inst_executed.sum,smsp__inst_executed_pipe_tensor_op_gmma.sum build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4 --routing $r --tokens 4096 --iters 3; done
# Call E (fresh machine, main 81d7fd8): Nsight Compute of the tile-8 decode GEMMs, DSV3 nvfp4
# uniform, with pipe utilizations and shared-memory counters (-e-ncu-decode.tgz). Issue slots busy
# / FMA-heavy pipe / ALU pipe / shared wavefronts (% of peak) / eligible warps per scheduler:
# 1 token fc1 50.1 / 51.1 / 41.0 / 40.6 / 0.84 (42.8 us, SM 1.81 GHz), fc2 42.6 / 46.7 / 40.6 /
# 33.2 / 1.18 (25.9 us); 128 tokens fc1 69.2 / 65.3 / 53.5 / 56.2 / 1.77 (1.03 ms, DRAM 83 %),
# fc2 70.0 / 60.9 / 54.2 / 54.5 / 1.82 (532 us, DRAM 80 %). Shared stores 4-5-way bank
# conflicted (the scale tables), 21-30 % of store wavefronts.
timeout 230 scripts/gpu_round.sh build; for t in 1 128; do ncu --clock-control none -k regex:sm90_moe_decode -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats --section WarpStateStats --section InstructionStats --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4 --routing uniform --tokens $t --iters 3; done
# Call F (fresh machine, 81d7fd8): Qwen3 nvfp4 8 tokens under ncu --graph-profiling graph
# --cache-control none, evict_normal / evict_first (-f-ncu-eager-stalls.tgz). The first 40
# profiled launches were eager kernels, not graph launches, and their durations under ncu are
# not usable (230-470 us for a ~40 us fc1). Per issued instruction, fc1's long-scoreboard stalls
# 2.48-3.23 (evict_normal) against 1.72-1.77 (evict_first), no-instruction stalls 0.12-0.21
# against 0.40-0.44; fc2 level. Inconclusive about the replays.
MOE_EP_WEIGHT_EVICT_FIRST=$ev ncu --graph-profiling graph --cache-control none --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats -c 40 build-gpu/bench/bench_layer --shape qwen3 --recipes nvfp4 --routing uniform --tokens 8 --iters 4  # ev = 0, 1
# Call G (fresh machine, branch s32-fc1-smem-pad before its commit: a knob MOE_EP_FC1_SMEM_KB=N
# giving a tile-8 fc1 with rings for 2 CTAs per SM a ring of at most N KB and N KB of dynamic
# shared memory; -g-pad-{dsv3,gptoss}-ab.log). DSV3 1 token nvfp4 70.6 / 70.5 (default, 4 slots)
# -> 69.3 / 69.7 (72 KB, 3 slots), 69.6 / 69.6 (76), 69.5 / 69.7 (80); mxfp4_mxfp8 65.1 / 65.5
# -> 65.3 / 64.8, 64.4 / 64.7, 64.7 / 64.5; gpt-oss nvfp4 1 token 37.1 / 37.1 -> 36.7 / 36.5
# (76 KB), 2 tokens level.
AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_FC1_SMEM_KB=72;this:MOE_EP_FC1_SMEM_KB=76;this:MOE_EP_FC1_SMEM_KB=80" AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1" scripts/gpu_round.sh ab  # then gpt-oss 1,2 with 76
# Call H (fresh machine, aa04d17: the room for fc2 by default, a third of the SM = 76 KB):
# GPU tests 39/39 incl. Fc1RoomForFc2SameBits (-h-gpu_tests.log); memcheck 0 errors, racecheck 0
# hazards (-h-sanitize.log); A/B MOE_EP_FC1_ROOM=0 against the default (-h-room-*-ab.log): DSV3
# nvfp4 1 token 70.4 / 70.8 -> 69.5 / 69.8, mxfp4_mxfp8 65.2 / 65.6 -> 64.4 / 64.6, 2 tokens
# (fc1 at 4 CTAs per SM, not taken) 117.2-117.5 -> 117.3-117.6 and 111.7-111.9 -> 110.9-111.1;
# Qwen3 nvfp4 2 / 3 tokens 31.1 / 31.1 -> 30.6 / 30.4 and 37.2 / 37.0 -> 37.0 / 36.7.
timeout 200 scripts/gpu_round.sh build; build-gpu/tests/moe_ep_gpu_tests; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FC1_ROOM=0;this" AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2" scripts/gpu_round.sh ab; AB_REPS=2 AB_VARIANTS="this:MOE_EP_FC1_ROOM=0;this" AB_ARGS="--shape qwen3 --recipes nvfp4 --routing uniform --tokens 2,3" scripts/gpu_round.sh ab; scripts/gpu_round.sh sanitize
# Call I (fresh machine, 9694651: the test's expectation from the SM count): Fc1RoomForFc2SameBits
# and WeightEvictFirstSameBits pass (2/2). The kernels are aa04d17's (only comments changed since).
timeout 170 scripts/gpu_round.sh build; build-gpu/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Fc1RoomForFc2SameBits:GpuLayer.WeightEvictFirstSameBits'
