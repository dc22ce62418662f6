"""Session 40: decode attention (``paged_attention.c``) of a commit's build against the working tree's, one
process (``benchmarks.many_rows.builds_to_compare``: this CPU's build unless ``--variant``): the read rate of
the distinct K and V rows per case (``benchmarks.decode_attention``'s cases and ``rates``, 3 rounds each, two
passes over the builds, medians). Against 70babd1 on a CPU where ``decode_attention_bf16`` (AMD's Zen 4): fp32 products against
bf16 ones.

    PYTHONPATH=. python docs/benchmarks/session40-amd/decode_attention_ab.py --base 70babd1
"""

from __future__ import annotations

import statistics

from benchmarks.decode_attention import CASES, rates
from benchmarks.machine import load_average
from benchmarks.many_rows import builds_to_compare


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print(f"# the working tree's products over a bf16 pool: {'bf16' if new.decode_attention_bf16 else 'fp32'}")
    print("| case | base GB/s | new GB/s | speed-up |")
    print("|---|---|---|---|")
    for name, *shape in CASES:
        measured: dict[str, list[float]] = {"base": [], "new": []}
        for _ in range(2):
            for build, kernels in (("base", base), ("new", new)):
                measured[build] += [kernel for kernel, _ in rates(kernels, *shape, 3)]
        before, after = statistics.median(measured["base"]), statistics.median(measured["new"])
        print(f"| {name} | {before:.1f} | {after:.1f} | {after / before:.2f}x |")
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
