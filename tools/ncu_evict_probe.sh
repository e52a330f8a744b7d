#!/usr/bin/env bash
# Nsight Compute counters of the decode GEMMs (time, DRAM bytes, L2 read/write sectors and hits),
# nvfp4, uniform routing: how much of the weight stream the L2 keeps. Runs on the device after
# `scripts/gpu_round.sh build`; NCU_CASES="shape tokens;shape tokens;..." (default DSV3 at 1 and 8
# tokens, Qwen3 at 8, 32 and 128); NCU_ARGS adds bench_layer arguments. Writes
# $OUT/ncu-evict.tgz (one CSV per case) and prints one line per kernel (tools/ncu_counters.py).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT/ncu-evict"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
M=$M,lts__t_sectors_op_read.sum,lts__t_sectors_op_read_lookup_hit.sum,lts__t_sectors_op_write.sum
IFS=';' read -r -a cases <<<"${NCU_CASES:-dsv3 1;dsv3 8;qwen3 8;qwen3 32;qwen3 128}"
for c in "${cases[@]}"; do
  read -r shape tokens <<<"$c"
  f="$OUT/ncu-evict/$shape-$tokens.csv"
  # shellcheck disable=SC2086
  timeout 120 "$NCU" --clock-control none -k regex:sm90_moe_decode -c 6 --metrics "$M" --csv \
    "$BUILD/bench/bench_layer" --shape "$shape" --recipes nvfp4 --routing uniform \
    --tokens "$tokens" --iters 3 ${NCU_ARGS:-} >"$f" 2>&1
done
python3 tools/ncu_counters.py "$OUT"/ncu-evict/*.csv
(cd "$OUT" && tar -czf ncu-evict.tgz ncu-evict && rm -rf ncu-evict)
