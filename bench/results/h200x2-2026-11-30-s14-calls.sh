# Session 14 device calls (nvidia-h200-x2), each through the device tool; outputs under
# bench/results/h200x2-2026-11-30-s14-<call>-*.
# Call A: branch s14-fastprep (2b94382) after `scripts/ab_base.sh main` (main = b5c9bd8), carry [".deps", "ab_base"]
# (its EP A/B was refused by bench_layer: --ep takes one recipe; rerun in call B)
GTEST_FILTER='GpuLayer*' scripts/gpu_round.sh build test multigpu 2>&1 | grep -E 'build|PASSED|FAILED|Failure|tests ran' | head -30; AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,4096" OUT=$OUT/ab1 scripts/gpu_round.sh ab 2>&1 | grep -v '^name\|^NVIDIA\|^shape'; AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --tokens 1,128,4096" OUT=$OUT/ab2 scripts/gpu_round.sh ab 2>&1 | grep -v '^name\|^NVIDIA'; scripts/gpu_round.sh pack
# Call B: same tree, warm machine, carry [".deps", "ab_base"]
scripts/gpu_round.sh multigpu 2>&1 | grep -E 'PASSED|FAILED|Failure|tests ran' | head; AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 1,128,4096" OUT=$OUT/ab2 scripts/gpu_round.sh ab 2>&1 | grep -v '^name\|^NVIDIA'; AB_REPS=1 AB_VARIANTS="base;this" AB_ARGS="--ep 2 --shape dsv3 --recipes mxfp4_mxfp8 --tokens 128,4096" OUT=$OUT/ab3 scripts/gpu_round.sh ab 2>&1 | grep -v '^name\|^NVIDIA'; scripts/gpu_round.sh pack
