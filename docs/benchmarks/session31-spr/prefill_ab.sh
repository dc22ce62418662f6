#!/bin/bash
# Session 31: a 2,000-token prompt alone (benchmarks.prefill_speed, the amx kernels), the commit before this
# session's change (a git worktree of BASE) and the working tree alternating, two rounds; the table rows only.
#   bash docs/benchmarks/session31-spr/prefill_ab.sh 00e6ea8
base=${1:?the baseline commit}
git worktree add -f /tmp/prefill_ab-base "$base" >/dev/null
for round in 1 2; do
    for tree in /tmp/prefill_ab-base "$PWD"; do
        (cd "$tree" && PYTHONPATH="$tree" python -m benchmarks.prefill_speed --models default scale-1.7b \
            --modes auto/float32 --repeats 2 --kernels c:amx 2>&1 | grep "^| default\|^| scale" | cut -c1-60 \
            | sed "s|^|$tree |")
    done
done
git worktree remove --force /tmp/prefill_ab-base
