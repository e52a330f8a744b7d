# Session 24 device calls through the device tool (all on nvidia-h200-x2, carry [".deps"]);
# outputs under bench/results/h200x2-2026-11-30-s24-<call>-*.
# Call A (1a38178 = main 33d79bb + the EP owner's L2 prefetch behind MOE_EP_PREFETCH=1, branch
# s23-ep-prefetch): GPU tests 32/32 and multi-GPU 27/27 (the first GPU run of session 23's review
# mends 0d393a0, 802cbc9, 33d79bb), the layer tests of the multi-GPU suite with the prefetch on
# (14/14), and the A/B of the prefetch at 1-8 tokens per rank (-a-ep2-prefetch-ab.log: level).
export MOE_EP_COMMIT=1a38178; timeout 300 scripts/gpu_round.sh build test multigpu; MOE_EP_PREFETCH=1 timeout 80 build-gpu/tests/multigpu/moe_ep_multigpu_tests --gtest_filter='EpLayer*:*EpLayerForced*' > $OUT/multigpu_prefetch.log 2>&1; grep -E "OK \]|FAILED|tests ran|Failure" $OUT/multigpu_prefetch.log | tail -25; OUT=$OUT/ab AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_PREFETCH=1;this:MOE_EP_PREFETCH=1 MOE_EP_PREFETCH_MB=20" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,2,4,8" timeout 170 scripts/gpu_round.sh ab; scripts/gpu_round.sh pack
# Call B (4363554, branch s24-prefetch-loads: the budget split over the local experts the own
# tokens use, mode 2 = plain loads, mode 3 = bulk prefetch with evict_last): EpLayer.* with modes 2
# and 3 (7/7 each), the A/B of modes 1/2/3 and mode 2 at 48 MB (-b-ep2-prefetch-modes-ab.log).
timeout 150 scripts/gpu_round.sh build; for m in 2 3; do MOE_EP_PREFETCH=$m timeout 70 build-gpu/tests/multigpu/moe_ep_multigpu_tests --gtest_filter='EpLayer.*' > $OUT/mg_pf$m.log 2>&1; echo "mode $m: $(grep -E 'tests ran|PASSED|FAILED' $OUT/mg_pf$m.log | tr '\n' ' ')"; done; OUT=$OUT/ab AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_PREFETCH=1;this:MOE_EP_PREFETCH=2;this:MOE_EP_PREFETCH=3;this:MOE_EP_PREFETCH=2 MOE_EP_PREFETCH_MB=48" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,2,4" timeout 240 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3|rank 1, graph" $OUT/ab/ab.log; scripts/gpu_round.sh pack
# Call C (738eaed, the timeline build with the EP stages): where each kernel of a graph replay runs
# at EP = 2 (1, 2, 8, 128 tokens per rank, each rank's own clock), at EP = 1 (E 256: 1, 2, 8, 128
# tokens) and at E = 128 (2, 4, 16, 256 tokens: the per-rank work of EP = 2) (-c-timeline.log).
export MOE_EP_COMMIT=738eaed; TIMELINE_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,2,8,128" timeout 400 scripts/gpu_round.sh timeline; OUT=$OUT/ep1 TIMELINE_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,2,8,128" timeout 100 scripts/gpu_round.sh timeline; OUT=$OUT/e128 TIMELINE_ARGS="--shape dsv3 --experts 128 --recipes nvfp4 --routing uniform --tokens 2,4,16,256" timeout 100 scripts/gpu_round.sh timeline; scripts/gpu_round.sh pack
# Call D (2287d4c, the one-block dispatch / signal-only combine on one system fence): multi-GPU
# 27/27 (-d-multigpu_tests.log, -d-ep_transfer.json: the decode round trip in a graph 19.2 -> 17.6
# us), the same-call A/B against MOE_EP_SOLO_BLOCK=0 at 1 / 2 / 8 / 128 tokens per rank, three runs
# (-d-solo-block-ab.log), and the EP = 2 timeline at 1 and 8 tokens per rank (-d-timeline-ep2.log).
export MOE_EP_COMMIT=2287d4c; timeout 220 scripts/gpu_round.sh build multigpu; OUT=$OUT/ab AB_REPS=3 AB_VARIANTS="this;this:MOE_EP_SOLO_BLOCK=0" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,2,8,128" timeout 200 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab/ab.log; OUT=$OUT/tl TIMELINE_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8" timeout 150 scripts/gpu_round.sh timeline; scripts/gpu_round.sh pack
# Call E (2287d4c, the session's final code): GPU tests 32/32 (-e-gpu_tests.log), moe-ep on one and
# two GPUs (-e-cli.log), the Python package (-e-python.log: 59 passed, 1 skipped), every BENCH.md
# case of DSV3 at EP = 2, both routings, with the E = 128 single-GPU reference
# (-e-layer-dsv3-ep2-*.{json,log}, -e-layer-dsv3-ep2.png drawn on the device with the PyTorch
# EP = 2 points, -e-layer-dsv3-ep1-e128.*).
export MOE_EP_COMMIT=2287d4c; timeout 200 scripts/gpu_round.sh build test > $OUT/bt.log 2>&1; tail -5 $OUT/bt.log; timeout 150 scripts/gpu_round.sh cli python > $OUT/cp.log 2>&1; grep -E "PASS|FAIL|passed|failed|rror" $OUT/cp.log | tail -8; BENCH_SHAPES="" BENCH_EP="2" BENCH_EP_SHAPES="dsv3" TORCH_SHAPES="" timeout 230 scripts/gpu_round.sh benchall > $OUT/ba.log 2>&1; grep -E "^dsv3" $OUT/ba.log | head -60; scripts/gpu_round.sh pack
# Call F (a178d9e, the dispatch reading the caller's count, ids and weights before its wait for the
# quantize grid): multi-GPU 27/27 (-f-multigpu_tests.log), the same-call A/B against
# MOE_EP_EARLY_INPUTS=0 at 1 / 2 / 8 tokens per rank, three runs (-f-early-inputs-ab.log), and the
# EP = 2 timeline at 1 token per rank (-f-timeline-ep2.log: the dispatch's signal at 7.0 us).
export MOE_EP_COMMIT=a178d9e; timeout 220 scripts/gpu_round.sh build multigpu > $OUT/bm.log 2>&1; grep -E "PASSED|FAILED|tests ran|decode round" $OUT/bm.log; OUT=$OUT/ab AB_REPS=3 AB_VARIANTS="this;this:MOE_EP_EARLY_INPUTS=0" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,2,8" timeout 150 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab/ab.log; OUT=$OUT/tl TIMELINE_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1" timeout 150 scripts/gpu_round.sh timeline; scripts/gpu_round.sh pack
# Call G (942dfc3, branch s24-finalize-waits, not kept: the finalize waiting for the owners' combine
# signals itself, the combine only signalling): multi-GPU 27/27 (-g-multigpu_tests.log), the
# same-call A/B against MOE_EP_FINALIZE_WAITS=0 at 1 / 8 / 128 tokens per rank, three runs
# (-g-finalize-waits-ab.log: level), the EP = 2 timeline at 1 token per rank (-g-timeline-ep2.log).
export MOE_EP_COMMIT=942dfc3; timeout 220 scripts/gpu_round.sh build multigpu > $OUT/bm.log 2>&1; grep -E "PASSED|FAILED|tests ran|Failure" $OUT/bm.log | head; OUT=$OUT/ab AB_REPS=3 AB_VARIANTS="this;this:MOE_EP_FINALIZE_WAITS=0" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8,128" timeout 170 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab/ab.log; OUT=$OUT/tl TIMELINE_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1" timeout 120 scripts/gpu_round.sh timeline; scripts/gpu_round.sh pack
# Call H (d31fd64, the session's final code): multi-GPU 27/27 with the transport test's new
# one-block cases (general arrival, early reads over 16 tiles and one; -h-multigpu_tests.log),
# GPU tests 32/32 (-h-gpu_tests.log).
export MOE_EP_COMMIT=d31fd64; timeout 120 scripts/gpu_round.sh build > $OUT/b.log 2>&1; tail -1 $OUT/b.log; timeout 90 scripts/gpu_round.sh multigpu > $OUT/m.log 2>&1; grep -E "PASSED|FAILED|tests ran|Failure|DataMovement" $OUT/m.log | head; timeout 70 scripts/gpu_round.sh test > $OUT/t.log 2>&1; grep -E "PASSED|FAILED|tests ran" $OUT/t.log | head -3; scripts/gpu_round.sh pack
