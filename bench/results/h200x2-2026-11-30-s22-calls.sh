# Session 22 device calls through the device tool; outputs under bench/results/
# h200[x2]-2026-11-30-s22-<call>-*. Carry [".deps"] (and "ab_base" where a base runs).
# Call A (nvidia-h200, branch s21-tile32-lean f432206 = main b32e5ee + the lean consumer behind
# MOE_EP_DECODE32_LEAN=1): GPU tests 32/32 (the first GPU run of session 21's review mends:
# expect_replays_equal_eager_tile8, any_nonzero), memcheck / racecheck of SmallForSanitizer clean;
# with MOE_EP_DECODE32_LEAN=1 GpuLayer.Decode* 5/5, but racecheck of Decode32SameBitsAsTile8
# 6 warnings (the lean consumer's scale-table writes against lds32 reads two chunks before; fixed
# in 0ff6b52 with a __syncwarp) (-a-*).
timeout 260 scripts/gpu_round.sh build test sanitize; B=build-gpu; MOE_EP_DECODE32_LEAN=1 $B/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Decode*'; MOE_EP_DECODE32_LEAN=1 compute-sanitizer --tool racecheck --error-exitcode 1 $B/tests/moe_ep_gpu_tests --gtest_filter='GpuLayer.Decode32SameBitsAsTile8'
# Call B (same machine, same tree): the default against MOE_EP_DECODE32_LEAN=1, MOE_EP_TILE_N=32
# and both, 12-20 rows per expert, nvfp4 (-b-lean-*-ab.log).
V="this;this:MOE_EP_DECODE32_LEAN=1;this:MOE_EP_TILE_N=32;this:MOE_EP_TILE_N=32 MOE_EP_DECODE32_LEAN=1"; for s in "dsv3 384,448,512,576,640" "gpt-oss 384,448,512,576,640" "qwen3 192,224,256,288,320"; do set -- $s; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $1 --recipes nvfp4 --routing uniform --tokens $2" scripts/gpu_round.sh ab; done
# Call C (nvidia-h200, 0ff6b52: lean by K): GpuLayer* 27/27 with Decode32SameBitsAsTile8 on both
# consumers and shapes, SmallForSanitizer with tile 32 memcheck / racecheck clean; gpt-oss 576
# alone (-d-history.log); tile 16 / 32 forced against the default at 14-20 rows (-c-band-*).
GTEST_FILTER='GpuLayer*' scripts/gpu_round.sh build test sanitize; V="this;this:MOE_EP_TILE_N=16;this:MOE_EP_TILE_N=32"; for s in "dsv3 448,480,512,544,576,640" "gpt-oss 448,480,512,544,576,640" "qwen3 224,240,256,272,288,320"; do set -- $s; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $1 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens $2" scripts/gpu_round.sh ab; done
# Call D (nvidia-h200-x2, bcddb58: tile 16 up to 15 rows everywhere; ab_base = main b32e5ee):
# gpt-oss history runs (-d-history.log); EP = 2 at 128 tokens per rank, the owner's tile 32 (this
# tree's choice at W x 16 rows) against tile 16: 1055.8-1058.0 against 917.2-917.8 us
# (-d-ep2-owner-tile-ab.log); main against this tree at 15-21 rows (-d-rule-*).
scripts/ab_base.sh main; OUT=$OUT/ep2 AB_REPS=3 AB_VARIANTS="this;this:MOE_EP_TILE_N=16" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 128" scripts/gpu_round.sh ab; for s in "dsv3 480,512,544,576,640,672" "gpt-oss 480,512,544,576,640,672" "qwen3 240,256,272,288,320,336"; do set -- $s; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--shape $1 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens $2" scripts/gpu_round.sh ab; done
# Call E (nvidia-h200-x2, 0e2bad7, the rule kept; ab_base = main b32e5ee): EP = 2 at 128 and 160
# tokens per rank, main against this tree (-e-final-ep2-ab.log), and the three shapes at 14-20
# rows (-e-final-*-ab.log).
OUT=$OUT/ep2 AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--ep 2 --shape dsv3 --recipes nvfp4 --tokens 128,160" scripts/gpu_round.sh ab; for s in "dsv3 448,480,512,544,576,640" "qwen3 224,240,256,272,288,320" "gpt-oss 512,544,576,640"; do set -- $s; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--shape $1 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens $2" scripts/gpu_round.sh ab; done
# Call F (nvidia-h200-x2, 0e2bad7): the whole round: GPU tests 32/32, memcheck 0 errors,
# racecheck 0 hazards, multi-GPU 27/27 at W = 2, moe-ep on one and two GPUs (28 PASS), Python 59
# passed 1 skipped (-f-*).
timeout 570 scripts/gpu_round.sh build test sanitize multigpu cli python
# Call G (nvidia-h200-x2, main 15aa73c; ab_base = b32e5ee): Zipf routing at 15-20 rows, main
# against this tree (-g-zipf-*-ab.log), then every BENCH.md case of DSV3 at EP = 1 (records
# -g-layer-dsv3.{json,log,png}; the plot redrawn here with the recorded PyTorch baseline
# bench/results/h200-2026-11-29-torch-baseline.json).
for s in "dsv3 480,512,544,576,640" "qwen3 240,256,272,288,320"; do set -- $s; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="base;this" AB_ARGS="--shape $1 --recipes nvfp4,mxfp4_mxfp8 --routing zipf --tokens $2" scripts/gpu_round.sh ab; done; BENCH_SHAPES="dsv3" BENCH_EP="" TORCH_SHAPES="" scripts/gpu_round.sh benchall
# (Call G's JSON records read "commit": "b32e5ee", the git metadata the device's copy carried
# from the session's start; the tree run was 15aa73c (its 512-token cases ran tile 32, which
# b32e5ee does not choose), so the field was corrected here. gpu_round.sh now takes
# MOE_EP_COMMIT from the call and otherwise marks such a tree "-dirty".)
# Call H (nvidia-h200, branch s22-tile8-lean5 adb11c2, not merged): tile 8 on 2-chunk slots with
# the lean consumer at 80 registers (5 CTAs per SM possible; MOE_EP_DECODE_CPS=2, with
# MOE_EP_DECODE_PER_SM=5): GpuLayer.Decode* / SmallForSanitizer / Compare* 6/6 with it, racecheck
# of SmallForSanitizer clean; slower than the default everywhere (-h-tile8-lean5-*).
T=build-gpu/tests/moe_ep_gpu_tests; MOE_EP_DECODE_CPS=2 MOE_EP_DECODE_PER_SM=5 $T --gtest_filter='GpuLayer.Decode*:GpuLayer.SmallFor*:GpuLayer.Compare*'; V="this;this:MOE_EP_DECODE_CPS=2;this:MOE_EP_DECODE_CPS=2 MOE_EP_DECODE_PER_SM=5"; for s in "qwen3 1,8,32,64" "gpt-oss 1,8,32,64,128" "dsv3 1,8,32,128"; do set -- $s; OUT=$OUT/$1 AB_REPS=2 AB_VARIANTS="$V" AB_ARGS="--shape $1 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens $2" scripts/gpu_round.sh ab; done
# Call I (nvidia-h200, main 7e96339): gpt-oss 576 tokens before and after other token counts in
# one process (-d-history.log, its second half).
B=build-gpu/bench/bench_layer; run() { echo "# ${1:-default}: $2"; env $1 $B --shape gpt-oss --recipes nvfp4 --routing uniform --tokens $2 | grep uniform; }; run "" 576,448,480,512,544,576; run "MOE_EP_TILE_N=32" 576,448,480,512,544,576; run "MOE_EP_DECODE16=0" 576,448,480,512,544,576; run "" 576,576,576,576,576,576; run "" 576,160,160,160,160,576; run "" 576,2048,2048,576; run "" 576,448,480,512,544,576
