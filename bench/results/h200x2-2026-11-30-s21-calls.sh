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
# Call D: the tile width forced on the smaller shapes (nvfp4 and mxfp4_mxfp8, 32-1024 tokens): the
# default choice is the fastest or level everywhere (-d-tile-choice-*-ab.log).
scripts/gpu_round.sh build 2>&1 | tail -1; V="this;this:MOE_EP_TILE_N=8;this:MOE_EP_TILE_N=16;this:MOE_EP_TILE_N=160;this:MOE_EP_DECODE16=0"; for s in qwen3 gpt-oss; do mkdir -p $OUT/$s; OUT=$OUT/$s AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $s --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 32,128,256,512,1024" timeout 270 scripts/gpu_round.sh ab 2>&1 | grep -E "^# [bt]|uniform"; done
# Call E: branch s21-tile32 at 3b4acc1 (the decode kernel's tile 32, knob only): GpuLayer* 27/27
# with GpuLayer.Decode32SameBitsAsTile8, memcheck of that test clean; tile 16 / 32 / 160 forced
# against the default (-e-*; the Qwen3 log did not come back: the device returns 8 files).
scripts/gpu_round.sh build 2>&1 | tail -1; B=build-gpu; timeout 150 $B/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer*' > $OUT/gpu_tests.log 2>&1; echo gpu rc=$?; grep -E "PASSED|FAILED|Decode32" $OUT/gpu_tests.log | head -8; V="this;this:MOE_EP_TILE_N=16;this:MOE_EP_TILE_N=32;this:MOE_EP_TILE_N=160"; for s in "dsv3 256,384,512,768,1024" "qwen3 128,192,256,384,512" "gpt-oss 256,384,512,768,1024"; do set -- $s; mkdir -p $OUT/$1; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $1 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens $2" timeout 150 scripts/gpu_round.sh ab > /dev/null 2>&1; echo "$1 rc=$?"; done; SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); timeout 100 $SAN --tool memcheck --error-exitcode 1 $B/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Decode32SameBitsAsTile8' > $OUT/memcheck32.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck32.log | tail -3
# Call F: s21-tile32 at 01bf52a: tile 32 on the plain loop (MOE_EP_DECODE_PIPE=0) against the
# pipelined one, 12-20 rows per expert (-f-*): the plain loop is far slower; the pipelined tile 32
# wins at 20 rows on all three shapes.
scripts/gpu_round.sh build 2>&1 | tail -1; B=build-gpu; timeout 60 $B/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Decode32*' > $OUT/t32.log 2>&1; echo t32 rc=$?; MOE_EP_DECODE_PIPE=0 timeout 60 $B/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Decode32*' > $OUT/t32plain.log 2>&1; echo t32plain rc=$?; V="this;this:MOE_EP_TILE_N=16;this:MOE_EP_TILE_N=32;this:MOE_EP_TILE_N=32 MOE_EP_DECODE_PIPE=0"; for s in "dsv3 256,384,512,640" "qwen3 128,192,256,320" "gpt-oss 256,384,512,640"; do set -- $s; mkdir -p $OUT/$1; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $1 --recipes nvfp4 --routing uniform --tokens $2" timeout 150 scripts/gpu_round.sh ab > /dev/null 2>&1; echo "$1 rc=$?"; done; scripts/gpu_round.sh pack
# Call G: s21-tile32 at 73c2211 (tile 32 the default between 17 and 21 mean rows), ab_base = main
# 31f0cc4, carry [".deps", "ab_base"]: GPU tests 32/32, memcheck / racecheck clean, racecheck of
# Decode32SameBitsAsTile8 clean, multi-GPU 27/27 with the default and with MOE_EP_TILE_N=32
# forced, A/B against main in and around the band (-g-*).
timeout 250 scripts/gpu_round.sh build test sanitize 2>&1 | grep -E 'build|PASSED|FAILED|Failure|memcheck|racecheck|tests ran|ERROR' | head; B=build-gpu; SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); timeout 110 $SAN --tool racecheck --error-exitcode 1 $B/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Decode32SameBitsAsTile8' > $OUT/racecheck32.log 2>&1; echo "racecheck32 rc=$?"; grep -E "RACECHECK SUMMARY" $OUT/racecheck32.log | tail -1; for t in 0 32; do env MOE_EP_TEST_WORLD=2 $( [ $t = 32 ] && echo MOE_EP_TILE_N=32 ) timeout 120 $B/tests/multigpu/moe_ep_multigpu_tests > $OUT/mg_tile$t.log 2>&1; echo "multigpu tile$t rc=$?"; grep -E "PASSED|FAILED" $OUT/mg_tile$t.log | head -4; done; V="base;this"; for s in "dsv3 512,576,640,672,768" "gpt-oss 512,576,640,672,768" "qwen3 256,288,320,336,384"; do set -- $s; mkdir -p $OUT/$1; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $1 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens $2" timeout 100 scripts/gpu_round.sh ab > /dev/null 2>&1; echo "$1 rc=$?"; done; scripts/gpu_round.sh pack
# Call H: main 98f696d (tile 32 merged, docs): the moe-ep command on one and two GPUs (28 PASS)
# and the Python package (torch tests on the GPU, the vLLM-style example) (-h-*).
timeout 320 scripts/gpu_round.sh build cli python 2>&1 | grep -E 'build|PASSED|FAILED|Failure|passed|failed|nccl|ERROR|rror|PASS' | head -30; scripts/gpu_round.sh pack
