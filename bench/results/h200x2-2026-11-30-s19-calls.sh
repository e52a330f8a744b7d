# Session 19 device calls, each through the device tool; outputs under
# bench/results/h200x2-2026-11-30-s19-<call>-*.
# Call A (nvidia-h200-x2): branch s19 93ce121 (main + s18-world-n + the CapturedGraph test helper), carry [".deps"]
git log --oneline -1 | cut -c1-70; GTEST_FILTER='GpuLayer*' scripts/gpu_round.sh build test multigpu 2>&1 | grep -E 'build|PASSED|FAILED|Failure|tests ran|== ' | head -40; grep -E "FAILED|Failure" -A8 $OUT/gpu_tests.log | head -30; grep -E "PASSED|FAILED" $OUT/multigpu_tests.log | head -3; scripts/gpu_round.sh pack
