set -u
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/round.log 2>&1; tail -1 $OUT/round.log
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
MOE_EP_WGMMA_V=4 timeout 200 $NCU --clock-control none -k regex:wgmma_ws -c 1 --section SourceCounters \
    --section WarpStateStats --section SchedulerStats --section SpeedOfLight -o $OUT/ws2048 \
    build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4 --routing uniform --tokens 2048 --iters 2 > $OUT/ncu.log 2>&1
$NCU -i $OUT/ws2048.ncu-rep --page source --csv --print-source sass > $OUT/ws_sass.csv 2>&1
$NCU -i $OUT/ws2048.ncu-rep --page details > $OUT/ws_details.txt 2>&1
rm -f $OUT/ws2048.ncu-rep
grep -E "Duration|Issued Warp|Eligible|DRAM Thr|L2 Cache Thr" $OUT/ws_details.txt
