#!/usr/bin/env bash
# Session 8, call E (nvidia-h200-x2, carry [".deps"]): (1) the EP owner's fc1 ring at 2 / 3 / 4
# CTAs per SM (MOE_EP_DECODE_PER_SM=N,0; fc2's ring at the estimate) at 1 / 2 / 8 tokens per
# rank, and the single-GPU layer at 1 / 8 tokens with the same knobs; (2) the m64 kernel
# (MOE_EP_TILE_N=160) against the decode kernel's tile 16 at 8-24 rows per expert.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=$OUT/work; mkdir -p $W
OUT=$W ./scripts/gpu_round.sh build > $W/round.log 2>&1; tail -1 $W/round.log
export NCCL_NVLS_ENABLE=0
NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
export LD_LIBRARY_PATH=$NCCL_DIR/lib:${LD_LIBRARY_PATH:-}
B=build-gpu/bench/bench_layer
for p in "" "2,0" "3,0" "4,0" ""; do
  echo "# MOE_EP_DECODE_PER_SM=$p"
  MOE_EP_DECODE_PER_SM=$p timeout 120 $B --ep 2 --shape dsv3 --recipes nvfp4 --routing uniform \
    --tokens 1,2,8 --iters 20 2>&1 | grep -vE "^\[moe-ep\]|^combine|^shape"
  MOE_EP_DECODE_PER_SM=$p timeout 60 $B --shape dsv3 --recipes nvfp4 --routing uniform \
    --tokens 1,8 --iters 20 2>&1 | grep uniform
done > $W/ep_owner_ab.log 2>&1
cat $W/ep_owner_ab.log
for t in "" 160 ""; do
  echo "# MOE_EP_TILE_N=$t"
  MOE_EP_TILE_N=$t timeout 100 $B --shape dsv3 --recipes nvfp4,mxfp4_mxfp8 --routing both \
    --tokens 256,512,768 --iters 20 2>&1 | grep -E "uniform|zipf"
  MOE_EP_TILE_N=$t timeout 60 $B --shape dsv3 --experts 128 --recipes nvfp4 --routing uniform \
    --tokens 128,192 --iters 20 2>&1 | grep -E "uniform"
done > $W/tile_ab.log 2>&1
cat $W/tile_ab.log
(cd $W && tar -czf $OUT/s8e.tar.gz .)
