set -u
OUT=$OUT ./scripts/gpu_round.sh build > $OUT/build_round.log 2>&1 || { tail $OUT/build_round.log; exit 1; }
export NCCL_NVLS_ENABLE=0
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
$NCU --version | tail -1
for t in 1 128; do
  timeout 200 $NCU --clock-control none -k regex:sm90_moe_decode -c 2 --section SourceCounters \
    --section WarpStateStats --section SchedulerStats --section SpeedOfLight -o $OUT/dec$t \
    build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4 --routing uniform --tokens $t --iters 3 > $OUT/ncu$t.log 2>&1
  $NCU -i $OUT/dec$t.ncu-rep --page source --csv --print-source sass > $OUT/dec${t}_sass.csv 2> $OUT/dec${t}_sass.err
  $NCU -i $OUT/dec$t.ncu-rep --page details > $OUT/dec${t}_details.txt 2>&1
  ls -la $OUT/dec${t}*; head -c 600 $OUT/dec${t}_sass.csv; echo
done
for s in 1 2,1 4,1; do echo "== SPLITK=$s"; MOE_EP_DECODE_SPLITK=$s build-gpu/bench/bench_layer --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing uniform --tokens 1,2,8 --iters 20 2>&1 | grep uniform; done > $OUT/splits.log
cat $OUT/splits.log
