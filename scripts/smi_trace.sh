#!/usr/bin/env bash
# Runs a command while nvidia-smi samples every GPU every 50 ms (time, GPU index, SM clock,
# power, temperature, active throttle reasons) into TRACE; prints the command's output, then per
# GPU a summary of the trace: the samples per set of active throttle reasons and the lowest SM
# clock of each set.
#   scripts/smi_trace.sh TRACE command [args...]
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
awk -F', *' 'NF >= 6 && $3 > 400 { k = $2 " " $6; n[k]++; if (!(k in lo) || $3 < lo[k]) lo[k] = $3
    if ($5 > t[$2]) t[$2] = $5 }
  END { for (k in n) { split(k, a, " "); printf "# trace GPU %s: reasons %s: %d samples, SM >= %d MHz (max temperature %d C)\n", a[1], a[2], n[k], lo[k], t[a[1]] } }' "$trace" | sort
exit $rc
