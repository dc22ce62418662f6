"""Prefill speed offline: one long prompt (2,000 tokens by default, issue #20's), prefilled alone with
nothing cached, in each mode (quantization / dtype), on the default model and the scale models.

*prefill tok/s*: prompt tokens over the time of the passes that prefill it (best of ``--repeats``
after a warm-up, the radix cache flushed before each); the prompt is random token ids (a prefill's
cost does not depend on which). *peak over loaded*: the process's highest resident memory during
the prefills (Linux's VmHWM, reset once the model is loaded) less its resident memory then: what a
long prompt adds to a loaded model. A mode that loads through dense temporaries (``none``) leaves
freed heap that its prefill reuses, so the column compares a mode with itself across commits, not
modes with each other; and where a pass's temporaries fall in glibc's heap moves the peak by hundreds of
MiB from one run to the next (docs/benchmarks/session35-spr/notes.md), so compare it over several runs.
The machine and the kernels' code path are printed first.

Run: python -m benchmarks.prefill_speed [--models default scale-1.7b] [--modes auto/float32 none/float32
     none/bfloat16] [--prompt-len 2000] [--repeats 3] [--kernels auto|torch|c:avx2 ...]
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from benchmarks.machine import load_average, machine_info
from benchmarks.scale_model import SCALE_MODELS, resolve_scale_model
from minisgl import LLM, SamplingParams
from minisgl.kernels.native import cpu_paths
from minisgl.kernels.variants import KERNEL_CHOICES


def _resident_kib(key: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def measure(model: str | None, mode: str, kernels: str, prompt_len: int, repeats: int) -> tuple[float, float, str]:
    """(best prefill seconds of a ``prompt_len``-token prompt, MiB its prefills added to the loaded
    model's resident memory at their peak, the kernels' code path) for ``mode`` ("quantization/dtype")
    on ``model`` (None: the default model)."""
    quantization, dtype = mode.split("/")
    llm = LLM(
        resolve_scale_model(model), quantization=quantization, dtype=dtype, kernels=kernels, max_running_req=1,
        num_page_override=prompt_len + 8,
    )  # fmt: skip
    try:
        prompt = torch.randint(1, llm.scheduler.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0))
        one = SamplingParams(max_tokens=1, ignore_eos=True)
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        loaded = _resident_kib("VmRSS")
        times = []
        for _ in range(repeats + 1):  # the first is the warm-up
            llm.flush_cache()
            start = time.perf_counter()
            llm.generate([prompt.tolist()], one, use_tqdm=False)
            times.append(time.perf_counter() - start)
        added = (_resident_kib("VmHWM") - loaded) / 1024
        paths = "; ".join(f"{k}: {v}" for k, v in cpu_paths(llm.scheduler.engine.kernels).items())
    finally:
        llm.shutdown()
        gc.collect()
    return min(times[1:]), added, paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", nargs="+", default=["default", "scale-1.7b"], help=f"default, {', '.join(SCALE_MODELS)} or a path"
    )
    parser.add_argument("--modes", nargs="+", default=["auto/float32", "none/float32", "none/bfloat16"])
    parser.add_argument("--prompt-len", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernels", default="auto", choices=KERNEL_CHOICES)
    args = parser.parse_args()
    print(machine_info(torch.get_num_threads()))
    print(f"load average before: {load_average()}")
    print(f"one {args.prompt_len}-token prompt, prefilled alone, nothing cached; best of {args.repeats}")
    print("| model | mode | prefill s | prefill tok/s | peak over loaded (MiB) | code path |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        for mode in args.modes:
            seconds, added, paths = measure(
                None if model == "default" else model, mode, args.kernels, args.prompt_len, args.repeats
            )
            print(
                f"| {model} | {mode} | {seconds:.2f} | {args.prompt_len / seconds:.0f} | {added:.0f} | {paths} |",
                flush=True,
            )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
