#!/usr/bin/env bash
# Writes revision REV's tree to ab_base/ (git-ignored, ~8 MB: name it in the device call's
# carry beside .deps, i.e. carry [".deps", "ab_base"]) for `scripts/gpu_round.sh build ab`,
# which builds it beside this tree and runs the same benchmark on both in one call.
#   tools/ab_base.sh REV      (e.g. main, HEAD~1, a commit)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: tools/ab_base.sh REV}
rm -rf ab_base
mkdir ab_base
git archive "$rev" | tar -x -C ab_base
echo "ab_base/ = $(git rev-parse --short "$rev") ($(du -sh ab_base | cut -f1))"
