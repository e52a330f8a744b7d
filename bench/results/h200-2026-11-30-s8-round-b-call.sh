#!/usr/bin/env bash
# Session 8, call B (nvidia-h200, carry [".deps"]): the m64 kernel at three CTAs per SM
# (MOE_EP_WGMMA_V=5) against the default at 1024-4096 tokens, uniform and Zipf routing; Nsight
# Compute of the decode GEMMs at 1 token (what limits fc2 there). Outputs packed in one archive.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/round.log 2>&1; tail -1 $OUT/round.log
W=$OUT/work; mkdir -p $W
for v in 0 5 0 5; do
  echo "# MOE_EP_WGMMA_V=$v"
  MOE_EP_WGMMA_V=$v timeout 150 build-gpu/bench/bench_layer --shape dsv3 \
    --recipes nvfp4,mxfp4_mxfp8,mxfp4_bf16 --routing both --tokens 1024,2048,4096 --iters 20 2>&1 |
    grep -E "uniform|zipf|rror"
done > $OUT/m64_3cta_ab.log 2>&1
cat $OUT/m64_3cta_ab.log
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 200 $NCU --clock-control none -k regex:sm90_moe_decode -c 2 --section SourceCounters \
  --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
  --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis -o $W/dec1 \
  build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4 --routing uniform --tokens 1 --iters 3 \
  > $W/ncu1.log 2>&1
$NCU -i $W/dec1.ncu-rep --page details > $W/dec1_details.txt 2>&1
$NCU -i $W/dec1.ncu-rep --page source --csv --print-source sass > $W/dec1_sass.csv 2>&1
grep -E "sm90_moe|Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|No Eligible|Achieved Occupancy|Waves" $W/dec1_details.txt | head -40
(cd $W && tar -czf $OUT/s8b.tar.gz .)
