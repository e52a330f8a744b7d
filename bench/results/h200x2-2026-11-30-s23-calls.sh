# Session 23 device calls through the device tool (all on nvidia-h200-x2, carry [".deps"]);
# outputs under bench/results/h200x2-2026-11-30-s23-<call>-*.
# Call A (002d6e5: main 5e65efb + the dispatch's bulk-store variant behind MOE_EP_DISPATCH_BULK,
# off by default; that variant now lives on branch s23-dispatch-bulk): GPU tests 32/32 (the first
# GPU run of session 22's review mends), multi-GPU 27/27 with the bulk cases, the transfer test
# with bulk configurations (85.1-87.2 us against 63.5-66.9 for warp stores at 4096 tokens per
# rank) and a token sweep (its printed bytes read a moved workspace table, fixed in ddeb0df; the
# times are right); gpt-oss 576 before / after tile-16 forwards under a clock trace (no step this
# time); EP = 2 A/B of the bulk stores in the layer (-a-ep2-bulk-ab.log).
export MOE_EP_COMMIT=002d6e5; timeout 400 scripts/gpu_round.sh build test multigpu; B=build-gpu/bench/bench_layer; H=$OUT/history; mkdir -p $H; for v in "576,160,160,160,160,576" "576,576,576,576,576,576"; do echo "# $v"; timeout 60 scripts/smi_trace.sh $H/trace-${v//,/_}.csv $B --shape gpt-oss --recipes nvfp4 --routing uniform --tokens $v --iters 20 2>&1 | grep -E "uniform|# trace"; done > $H/history.log 2>&1; cat $H/history.log; OUT=$OUT/ep2 AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DISPATCH_BULK=1" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 1,128,4096" timeout 120 scripts/gpu_round.sh ab; scripts/gpu_round.sh pack
# Call B (7990354): the transfer test's token sweep with correct bytes (-b-ep_transfer.json);
# DSV3 nvfp4 / mxfp4_mxfp8 at 1-4096 tokens with the new graph-of-8-forwards measurement, under a
# clock trace (-b-graph-sequence-*).
export MOE_EP_COMMIT=7990354 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; timeout 200 scripts/gpu_round.sh build > $OUT/build_step.log 2>&1; tail -2 $OUT/build_step.log; MOE_EP_BENCH_JSON=$OUT/ep_transfer.json timeout 60 build-gpu/tests/multigpu/moe_ep_multigpu_tests --gtest_filter=MultiGpu.DsV3TransferBandwidth > $OUT/transfer.log 2>&1; B=build-gpu/bench/bench_layer; timeout 150 scripts/smi_trace.sh $OUT/trace.csv $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,8,128,512,4096 --iters 20 --json $OUT/seq.json > $OUT/seq.log 2>&1
# Call C (7990354): every BENCH.md case of DSV3 at EP = 2 (logs -c-layer-dsv3-ep2-*.log; the
# records of call D replace its JSON).
export MOE_EP_COMMIT=7990354; timeout 200 scripts/gpu_round.sh build > $OUT/build_step.log 2>&1; BENCH_SHAPES="" BENCH_EP="2" TORCH_SHAPES="" timeout 380 scripts/gpu_round.sh benchall
# Call D (075467d): the transfer test with the sweep from 1 token (-d-multigpu-transfer.log,
# -d-ep_transfer.json); every BENCH.md case of DSV3 at EP = 2 with dispatch_bytes / nvlink_GBps
# in the records (-d-layer-dsv3-ep2-*.{json,log}, -d-layer-dsv3-ep2.png, -d-layer-dsv3-ep1-e128.*);
# the owner's fc1 ring at 2 / 3 / 4 CTAs per SM against the default at 1 and 128 tokens per rank
# (-d-ep2-per-sm-ab.log); moe-ep on one and two GPUs (-d-cli.log, 28 PASS) and the Python
# package (-d-python.log: 59 passed, 1 skipped).
export MOE_EP_COMMIT=075467d NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; timeout 200 scripts/gpu_round.sh build > $OUT/build_step.log 2>&1; MOE_EP_BENCH_JSON=$OUT/ep_transfer.json timeout 60 build-gpu/tests/multigpu/moe_ep_multigpu_tests --gtest_filter=MultiGpu.DsV3TransferBandwidth > $OUT/transfer.log 2>&1; BENCH_SHAPES="" BENCH_EP="2" TORCH_SHAPES="" timeout 150 scripts/gpu_round.sh benchall; OUT=$OUT/ab AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_PER_SM=2,0;this:MOE_EP_DECODE_PER_SM=3,0;this:MOE_EP_DECODE_PER_SM=4,0" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 1,128" timeout 150 scripts/gpu_round.sh ab; timeout 200 scripts/gpu_round.sh cli python; scripts/gpu_round.sh pack
# Call E (ae2b709): order against power state. DSV3 nvfp4, EP = 2 and EP = 1, the sweep's order
# (1, 8, 32, 128 tokens in one process) against 128 tokens alone, alternating, twice, with every
# replay's time (MOE_EP_BENCH_TRACE=1) and both GPUs' clocks, power and throttle reasons every
# 50 ms (-e-history.log, -e-history-traces.csv).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; timeout 200 scripts/gpu_round.sh build > $OUT/build_step.log 2>&1; B=build-gpu/bench/bench_layer; H=$OUT/hist; mkdir -p $H; i=0; for rep in 1 2; do for a in "--ep 2|1,8,32,128" "--ep 2|128" "|1,8,32,128" "|128"; do i=$((i+1)); e=${a%%|*}; t=${a#*|}; echo "## run $i: $e tokens $t, start $(date +%T.%N)"; MOE_EP_BENCH_TRACE=1 timeout 90 scripts/smi_trace.sh $H/trace-$i.csv $B $e --shape dsv3 --recipes nvfp4 --routing uniform --tokens $t --iters 20 2>&1 | grep -E "^dsv3|stages|replays us|# trace"; echo "## end $(date +%T.%N)"; done; done > $H/hist.log 2>&1
# Call F (d09e1de, the session's final code): GPU tests 32/32, multi-GPU 27/27 at W = 2 (the
# transfer test's dispatch 64.0-64.3 us at 64 / 132 blocks, 71-72 %; its sweep as call D's).
export MOE_EP_COMMIT=d09e1de; timeout 470 scripts/gpu_round.sh build test multigpu; scripts/gpu_round.sh pack
# Call G (5a4b9dc): every BENCH.md case of DSV3 at EP = 1 with the graph-of-8-forwards
# measurement after each case (then on by default), and EP = 2 at 1 token per rank
# (-g-layer-dsv3-with-sequences.log; its JSON not kept as a record). The 128-token cases read
# 2137.8 (nvfp4) / 1746.3 / 1832.6 us, right after the 32-token case's graph of 8 forwards, while
# their own graphs of 8 read 1704.7 / 1657.4 / 1660.0 per forward: the seconds of sustained load
# that measurement adds engage the power limiter for the next case. It is opt-in since
# (MOE_EP_BENCH_SEQ=8).
export MOE_EP_COMMIT=5a4b9dc; timeout 200 scripts/gpu_round.sh build; BENCH_SHAPES="dsv3" BENCH_EP="" TORCH_SHAPES="" timeout 250 scripts/gpu_round.sh benchall; MOE_EP_BENCH_TRACE=1 timeout 60 build-gpu/bench/bench_layer --ep 2 --shape dsv3 --recipes nvfp4 --tokens 1 --iters 20
# Call H (1b57933, the graph sequence opt-in): every BENCH.md case of DSV3 at EP = 1, the record
# of the final tree (-h-layer-dsv3.{json,log}, -h-quantize.json; the plot -h-layer-dsv3.png drawn
# here with the recorded PyTorch baseline bench/results/h200-2026-11-29-torch-baseline.json).
# graph_sequence_us is null in every record (not measured by default).
export MOE_EP_COMMIT=1b57933; timeout 200 scripts/gpu_round.sh build; BENCH_SHAPES="dsv3" BENCH_EP="" TORCH_SHAPES="" timeout 200 scripts/gpu_round.sh benchall
# Call I (b6ec8a6, EP records with Zipf routing too): every BENCH.md case of DSV3 at EP = 2, both
# routings (-i-layer-dsv3-ep2-*.{json,log}, -i-layer-dsv3-ep2.png, -i-layer-dsv3-ep1-e128.*).
export MOE_EP_COMMIT=b6ec8a6; timeout 200 scripts/gpu_round.sh build; BENCH_SHAPES="" BENCH_EP="2" TORCH_SHAPES="" timeout 260 scripts/gpu_round.sh benchall
# Call J (efc2a28, benchall's EP loop over the three shapes): every BENCH.md case of Qwen3 and
# gpt-oss at EP = 2, both routings, each with its E = 64 single-GPU reference (the first EP = 2
# records of those shapes; -j-layer-{qwen3,gpt-oss}-ep2-*, -j-layer-*-ep1-e64.*). No PyTorch EP = 2
# baseline exists for them (DEVICE.md gives DSV3's).
export MOE_EP_COMMIT=efc2a28; timeout 120 scripts/gpu_round.sh build; BENCH_SHAPES="" BENCH_EP="2" BENCH_EP_SHAPES="qwen3 gpt-oss" TORCH_SHAPES="" timeout 250 scripts/gpu_round.sh benchall
# Call K (6185c6a, bench_layer's shared input-set helper): DSV3 nvfp4 at 1 and 128 tokens, both
# routings, and Qwen3 at EP = 2 with 0, 1 and 64 tokens per rank, both routings, ran; an unknown
# --routing is refused. (Output in the session's notes only: 1 token 73.2 / 74.0 us, 128 tokens
# 1658.9 / 1694.6; Qwen3 EP = 2 0 / 1 / 64 tokens 19.3 / 43.6 / 108.2 us uniform.)
B=build-gpu/bench/bench_layer; timeout 120 scripts/gpu_round.sh build; $B --shape dsv3 --recipes nvfp4 --tokens 1,128 --routing both --iters 20; $B --ep 2 --shape qwen3 --recipes nvfp4 --tokens 0,1,64 --iters 20; $B --routing zipff
