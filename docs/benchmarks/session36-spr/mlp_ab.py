"""Session 36: a prefill pass's MLP at 135M, the session's code (``GatedMLP.forward``: the down projection
takes gate_up itself and writes each band into the pass's output) against the way before it, in one process,
alternating: each band's activation written out by ``silu_and_mul``, then the down projection into a new
tensor copied into the pass's output (what ``GatedMLP.forward`` did at d5bb0a6), and the same with the copy
alone removed. All 30 layers of the default model, 2,048 prefill rows (8 bands of 256), ``--rounds`` times;
the bits of the two ways are checked equal first.

    PYTHONPATH=. python docs/benchmarks/session36-spr/mlp_ab.py
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.machine import machine_info
from minisgl.layers.mlp import GatedMLP
from minisgl.llm import LLM
from minisgl.tuning import MLP_BAND_ROWS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    print(machine_info(torch.get_num_threads()))
    llm = LLM()
    mlps = [m for m in gc.get_objects() if isinstance(m, GatedMLP)]
    x = torch.randn(args.rows, mlps[0].down_proj.shape[0])

    def written_out(mlp: GatedMLP, copy: bool) -> torch.Tensor:
        out = x.new_empty(x.shape)
        for start in range(0, len(x), MLP_BAND_ROWS):
            band = x[start : start + MLP_BAND_ROWS]
            act = mlp._act_and_mul(mlp.gate_up_proj(band, len(band)))
            if copy:
                out[start : start + len(band)] = mlp.down_proj(act, len(band))
            else:
                mlp.down_proj(act, len(band), out[start : start + len(band)])
        return out

    ways: dict[str, Callable[[GatedMLP], torch.Tensor]] = {
        "before (activation written out, band copied)": lambda m: written_out(m, True),
        "activation written out, no copy": lambda m: written_out(m, False),
        "now (GatedMLP.forward)": lambda m: m(x, len(x)),
    }
    assert all(torch.equal(f(mlps[0]), mlps[0](x, len(x))) for f in ways.values())
    times: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(args.rounds + 1):
        for name, f in ways.items():
            start = time.perf_counter()
            for m in mlps:
                f(m)
            if r:  # the first round warms up
                times[name].append((time.perf_counter() - start) * 1e3)
    llm.shutdown()
    before = times[next(iter(ways))]
    print(f"{len(mlps)} layers' MLPs, {args.rows} prefill rows, {args.rounds} rounds (ms a pass: median, min)")
    for name, t in times.items():
        ratio = statistics.median(b / a for a, b in zip(t, before))
        print(f"{name}: {statistics.median(t):.1f}, {min(t):.1f}; speed over before, median of pairs {ratio:.3f}")


if __name__ == "__main__":
    main()
