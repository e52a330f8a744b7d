#!/usr/bin/env bash
# Runs a command while nvidia-smi samples GPU 0 every 50 ms (time, SM clock, power, temperature,
# active throttle reasons) into TRACE; prints the command's output, then a summary of the trace:
# the samples per set of active throttle reasons and the lowest SM clock of each set.
#   scripts/smi_trace.sh TRACE command [args...]
set -uo pipefail
trace=$1
shift
if ! command -v nvidia-smi >/dev/null; then
  "$@"
  exit $?
fi
nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 50 >"$trace" 2>/dev/null &
pid=$!
"$@"
rc=$?
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
awk -F', *' 'NF >= 5 && $2 > 400 { n[$5]++; if (!($5 in lo) || $2 < lo[$5]) lo[$5] = $2; if ($4 > t) t = $4 }
  END { printf "# trace %s: max temperature %d C;", FILENAME, t
        for (k in n) printf " reasons %s: %d samples, SM >= %d MHz;", k, n[k], lo[k]; printf "\n" }' "$trace"
exit $rc
