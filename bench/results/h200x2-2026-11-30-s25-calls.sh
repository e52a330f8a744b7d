#!/usr/bin/env bash
# Session 25's device calls (nvidia-h200-x2, carry [".deps"]), in order.
# Call A (f06712e: main with session 24's review mend 058c139, its first GPU run):
MOE_EP_COMMIT=f06712e scripts/gpu_round.sh build test multigpu pack
#   -> -s25-a-gpu_tests.log (32/32), -s25-a-multigpu_tests.log (27/27)
