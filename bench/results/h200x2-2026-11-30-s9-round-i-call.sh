#!/usr/bin/env bash
# Session 9, call I (nvidia-h200-x2, carry [".deps"]): the final tree's decode cases again (call H
# ran the unchanged decode kernels 5-14 % slower than call F): 1 and 128 tokens, three 4-bit
# recipes, two runs, and nvfp4 at 4096 tokens, with the SM clock logged.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build > $W/round.log 2>&1; tail -1 $W/round.log
B=build-gpu/bench/bench_layer
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -i 0 -lms 50 > $W/clocks.csv 2>&1 &
SMI=$!
for rep in 1 2; do
  timeout 60 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing uniform \
    --tokens 1,128 --iters 20 2>&1 | grep -E "uniform|rror"
done > $W/decode_again.log 2>&1
timeout 60 $B --shape dsv3 --recipes nvfp4 --routing uniform --tokens 4096 --iters 20 2>&1 |
  grep -E "uniform|rror" >> $W/decode_again.log
kill $SMI
cat $W/decode_again.log
awk -F', ' 'NR>1 {c[$2]++} END {for (k in c) printf "%s:%d ", k, c[k]; print ""}' $W/clocks.csv
(cd $W && tar -czf $OUT/s9i.tar.gz --exclude build.log .)
