# Session 18 device calls, each through the device tool; outputs under
# bench/results/h200x2-2026-11-30-s18-<call>-*.
# Call A (nvidia-h200-x2): main 9ca490a (session 17's review commits + the fused-stream probe cases), carry [".deps"]
git log --oneline -1; scripts/gpu_round.sh build test sanitize multigpu stream 2>&1 | grep -E 'build|PASSED|FAILED|Failure|memcheck|racecheck|tests ran|==|t1 |t128|case' | head -60; grep -E "FAILED|Failure" -A8 $OUT/gpu_tests.log | head -30; grep -E "PASSED|FAILED" $OUT/multigpu_tests.log | head -3; scripts/gpu_round.sh pack
