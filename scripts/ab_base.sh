#!/usr/bin/env bash
# Writes revision REV's tree to ab_base/ (untracked, not ignored: the device tool copies it with
# the working tree) for `scripts/gpu_round.sh build ab`, which builds it beside this tree and
# runs the same benchmark on both in one call. Remove ab_base/ after the call.
#   scripts/ab_base.sh REV      (e.g. main, HEAD~1, a commit)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/ab_base.sh REV}
rm -rf ab_base
mkdir ab_base
git archive "$rev" | tar -x -C ab_base
echo "ab_base/ = $(git rev-parse --short "$rev") ($(du -sh ab_base | cut -f1))"
