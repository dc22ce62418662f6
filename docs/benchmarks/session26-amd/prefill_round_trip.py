"""One 64-token prompt (token ids), one output token, cache emptied before each: offline ``LLM.generate``'s
time against a round trip through the server's ``/v1/completions``, 8 prompts each after a warm-up.

Run from the repository root: ``python docs/benchmarks/session26-amd/prefill_round_trip.py offline``, or with
``python -m minisgl serve --port 1931`` up: ``... prefill_round_trip.py server``."""

import json
import random
import sys
import time
import urllib.request

URL = "http://127.0.0.1:1931"
rng = random.Random(0)
prompts = [[rng.randrange(1000, 40000) for _ in range(64)] for _ in range(9)]


def post(path: str, body: dict) -> float:
    request = urllib.request.Request(URL + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    start = time.perf_counter()
    urllib.request.urlopen(request).read()
    return time.perf_counter() - start


def server() -> list[float]:
    model = json.loads(urllib.request.urlopen(URL + "/v1/models").read())["data"][0]["id"]
    times = []
    for p in prompts:
        post("/flush_cache", {})
        times.append(post("/v1/completions", {"model": model, "prompt": p, "max_tokens": 1, "ignore_eos": True}))
    return times[1:]


def offline() -> list[float]:
    from minisgl import LLM, SamplingParams

    llm, params, times = LLM(), SamplingParams(max_tokens=1, ignore_eos=True), []
    for p in prompts:
        llm.flush_cache()
        start = time.perf_counter()
        llm.generate([p], params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return times[1:]


print(sys.argv[1], "ms:", [round(t * 1e3, 1) for t in (server() if sys.argv[1] == "server" else offline())])
