#!/usr/bin/env bash
# Runs a command while nvidia-smi samples every GPU every 50 ms (time, GPU index, SM clock,
# power, temperature, active throttle reasons) into TRACE; prints the command's output, then one
# line per GPU: SM clock min / median / max, the highest power reading, the samples with the
# software power cap active (throttle reason 0x4; the board's 700 W cap lowers the SM clock
# partway through long runs), the samples per set of active throttle reasons, and the highest
# temperature. Exits with the command's status.
#   tools/smi_trace.sh TRACE command [args...]
set -uo pipefail
trace=$1
shift
if ! command -v nvidia-smi >/dev/null; then
  "$@"
  exit $?
fi
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 50 >"$trace" 2>/dev/null &
pid=$!
"$@"
rc=$?
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
# Sorted by GPU, then SM clock: each GPU's samples arrive in clock order (median by index).
sort -t, -k2,2n -k3,3n "$trace" | awk -F', *' 'NF >= 6 && $3 > 400 {
    g = $2; if (!(g in n)) order[ng++] = g
    c[g, n[g]++] = $3; if ($4 > p[g]) p[g] = $4; if ($5 > t[g]) t[g] = $5
    if ($6 ~ /[4567cdefCDEF]$/) cap[g]++; r[g, $6]++ }
  END { for (i = 0; i < ng; ++i) { g = order[i]
      printf "# clocks GPU %s: SM %d / %d / %d MHz (min / median / max), power <= %.0f W, power cap in %d of %d samples, reasons", g, c[g, 0], c[g, int(n[g] / 2)], c[g, n[g] - 1], p[g], cap[g], n[g]
      for (k in r) { split(k, kk, SUBSEP); if (kk[1] == g) printf " %s:%d", kk[2], r[k] }
      printf ", max temperature %d C\n", t[g] } }'
exit $rc
