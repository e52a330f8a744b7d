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
