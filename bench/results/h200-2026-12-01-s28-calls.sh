#!/usr/bin/env bash
# Session 28's device calls (nvidia-h200, the only kind lent), in order; carry [".deps"] (and
# "ab_base" where an A/B builds another revision).
# Call A (main c8ea128, session 27's review mend, first run on a GPU): build, GPU tests 34/34
# (-a-gpu-tests.log); the 11 output hashes of GpuLayer.Fp8PathMxfp4Mxfp8 equal session 27's
# call G (dsv3 T=1 b3060afdcec701e7 ... qwen3 T=400 167e1e4b31ce4d76).
export MOE_EP_COMMIT=c8ea128; timeout 300 scripts/gpu_round.sh build test > $OUT/round.log 2>&1; echo rc=$?; tail -45 $OUT/round.log; grep -E "fp8-vs-cpu|hash" $OUT/gpu_tests.log | head -30
