#!/usr/bin/env bash
# Session 25's device calls (nvidia-h200-x2, carry [".deps"]), in order.
# Call A (f06712e: main with session 24's review mend 058c139, its first GPU run):
MOE_EP_COMMIT=f06712e scripts/gpu_round.sh build test multigpu pack
#   -> -s25-a-gpu_tests.log (32/32), -s25-a-multigpu_tests.log (27/27)
# Call B (e2d1cf5, branch s25-streamk: the first stream-K decode, epilogue on the consumer warps,
# opt-in MOE_EP_DECODE_SK): the stream-K and split-K GPU tests (-b-gpu_tests.log: nvfp4 not
# bitwise where a run held an uncut M-tile, whose epilogue had no barrier before it), racecheck
# (-b-racecheck-summary.txt: the epilogue's staging writes against other warps' last loads of the
# slot), the EP = 1 A/B at 1 / 8 / 128 tokens (-b-streamk-v1-ab.log: slower everywhere).
export MOE_EP_COMMIT=e2d1cf5; timeout 150 scripts/gpu_round.sh build > $OUT/b.log 2>&1; tail -1 $OUT/b.log; GTEST_FILTER='GpuLayer.DecodeStreamK*:GpuLayer.DecodeSplitK*:GpuLayerHost.*' timeout 100 scripts/gpu_round.sh test > $OUT/t.log 2>&1; grep -E "PASSED|FAILED|tests ran|Failure|stream-k|Expected|Which is" $OUT/t.log | head -60; timeout 150 scripts/gpu_round.sh sanitize > $OUT/s.log 2>&1; grep -E "memcheck|racecheck" $OUT/s.log; OUT=$OUT/ab AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_SK=2,4;this:MOE_EP_DECODE_SK=2,0;this:MOE_EP_DECODE_SK=4,4" AB_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8,128" timeout 230 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab/ab.log; scripts/gpu_round.sh pack
# Call C (89ece56, branch s25-streamk: every M-tile cut into runs, the consumers handing each
# M-tile's accumulators to an epilogue warp): stream-K GPU tests 5/5 (-c-gpu_tests.log, nvfp4
# bitwise), memcheck 0 errors, racecheck 0 hazards; A/B at EP = 1 (-c-streamk-v2-ep1-ab.log) and
# EP = 2 (-c-streamk-v2-ep2-ab.log): slower everywhere.
export MOE_EP_COMMIT=89ece56; timeout 150 scripts/gpu_round.sh build > $OUT/b.log 2>&1; tail -1 $OUT/b.log; GTEST_FILTER='GpuLayer.DecodeStreamK*:GpuLayerHost.*' timeout 80 scripts/gpu_round.sh test > $OUT/t.log 2>&1; grep -E "PASSED|FAILED|tests ran|Failure|stream-k" $OUT/t.log | head -40; timeout 120 scripts/gpu_round.sh sanitize > $OUT/s.log 2>&1; grep -E "memcheck|racecheck" $OUT/s.log; OUT=$OUT/ab AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_SK=2,0;this:MOE_EP_DECODE_SK=2,3;this:MOE_EP_DECODE_SK=3,3" AB_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8" timeout 150 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab/ab.log; OUT=$OUT/ab2 AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_SK=2,0;this:MOE_EP_DECODE_SK=2,3" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8" timeout 150 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab2/ab.log; scripts/gpu_round.sh pack
# Call D (11de249: the hybrid plan, whole M-tiles dealt out first, only the remainder cut):
# stream-K GPU tests 5/5 (-d-gpu_tests.log), memcheck 0 errors, racecheck 0 hazards (the
# sanitizer case now cuts fc1 M-tiles); A/B at EP = 1 (-d-streamk-hybrid-ep1-ab.log) and EP = 2
# (-d-streamk-hybrid-ep2-ab.log): level where every M-tile is whole, slower where a CTA runs several.
export MOE_EP_COMMIT=11de249; timeout 150 scripts/gpu_round.sh build > $OUT/b.log 2>&1; tail -1 $OUT/b.log; GTEST_FILTER='GpuLayer.DecodeStreamK*:GpuLayerHost.*' timeout 80 scripts/gpu_round.sh test > $OUT/t.log 2>&1; grep -E "PASSED|FAILED|tests ran|Failure" $OUT/t.log | head -20; timeout 150 scripts/gpu_round.sh sanitize > $OUT/s.log 2>&1; grep -E "memcheck|racecheck" $OUT/s.log; OUT=$OUT/ab AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_SK=2,0;this:MOE_EP_DECODE_SK=2,3" AB_ARGS="--shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8" timeout 120 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab/ab.log; OUT=$OUT/ab2 AB_REPS=2 AB_VARIANTS="this;this:MOE_EP_DECODE_SK=2,0;this:MOE_EP_DECODE_SK=2,3;this:MOE_EP_DECODE_SK=0,3" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1,8" timeout 200 scripts/gpu_round.sh ab > /dev/null; grep -E "^# this|^dsv3" $OUT/ab2/ab.log; scripts/gpu_round.sh pack
