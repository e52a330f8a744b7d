# Session 21 device calls, each through the device tool (nvidia-h200-x2, carry [".deps"]), tree
# = main cc3313a unless noted; outputs under bench/results/h200x2-2026-11-30-s21-<call>-*.
# Call A: the whole round on main (first GPU run of the late-setup tests, of the review commits
# f3a322d and cc3313a, and of gpu_round.sh without LD_LIBRARY_PATH). GPU tests 31/31 (with
# GpuLayer.DecodeLateSetupSameBits and SmallForSanitizer at a first wave of one CTA), memcheck 0
# errors, racecheck 0 hazards, multi-GPU 27/27 at W = 2, moe-ep run / check --gpus 2, Python 59
# passed 1 skipped.
timeout 570 scripts/gpu_round.sh build test sanitize multigpu cli python 2>&1 | grep -E 'build|PASSED|FAILED|Failure|memcheck|racecheck|tests ran|== |passed|failed|nccl|ERROR|rror' | head -60; grep -E "DecodeLateSetup|SmallForSanitizer" $OUT/gpu_tests.log | head; scripts/gpu_round.sh pack
# Call B: every BENCH.md case of the three shapes at EP = 1 and DSV3 at EP = 2 (the PyTorch
# baselines are the recorded ones), records and plots -b-*.
BENCH_SHAPES="dsv3 qwen3 gpt-oss" TORCH_SHAPES="" timeout 560 scripts/gpu_round.sh build benchall 2>&1 | grep -v "^name\|^NVIDIA" | tail -80; [ -f $OUT/bench.tar.gz ] || tar -C $OUT -czf $OUT/bench.tar.gz bench; ls -la $OUT
# Call C: forced K-splits of the decode GEMMs on the smaller shapes (nvfp4, 1 / 8 / 32 tokens;
# two alternating runs): none faster than the default (-c-splitk-*-ab.log).
scripts/gpu_round.sh build 2>&1 | tail -1; V="this;this:MOE_EP_DECODE_SPLITK=2,1;this:MOE_EP_DECODE_SPLITK=1,2;this:MOE_EP_DECODE_SPLITK=2,2;this:MOE_EP_DECODE_SPLITK=4,2;this:MOE_EP_DECODE_SPLITK=4,4"; for s in qwen3 gpt-oss; do mkdir -p $OUT/$s; OUT=$OUT/$s AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $s --recipes nvfp4 --routing uniform --tokens 1,8,32" timeout 260 scripts/gpu_round.sh ab 2>&1 | grep -E "^# [bt]|uniform"; done
