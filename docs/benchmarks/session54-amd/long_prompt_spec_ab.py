"""Scratch A/B behind the README's Zen 3 table: a 2,000-token prompt's prefill on the default model with n-gram
speculation on (the default) and off, each in a fresh process, to be alternated:

    for i in 1 2; do for a in ngram none; do PYTHONPATH=. python docs/benchmarks/session54-amd/long_prompt_spec_ab.py $a; done; done

Prints the algorithm and four timed prefills (1 token out) after one warm-up."""

import random
import sys
import time

from benchmarks.machine import code_path
from minisgl import LLM, SamplingParams

algorithm = sys.argv[1]
print("#", code_path(), file=sys.stderr)
llm = LLM(speculative_algorithm=algorithm)
rng = random.Random(0)
one_token = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
llm.generate([[rng.randrange(100, 40000) for _ in range(2000)]], one_token)
times = []
for _ in range(4):
    ids = [rng.randrange(100, 40000) for _ in range(2000)]
    start = time.perf_counter()
    llm.generate([ids], one_token)
    times.append(time.perf_counter() - start)
print(algorithm, " ".join(f"{t:.2f}" for t in times), flush=True)
