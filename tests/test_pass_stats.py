"""Each forward pass is booked by what its requests computed, and its attention is named by its shape:
checked pass by pass against the batch itself, for every kind of pass (a prefill alone, a prefill
with decodes riding along, a decode step, and a decode step after a jump-forward)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import pytest

from minisgl import LLM, SamplingParams
from minisgl.batch import AttentionKind, Batch
from minisgl.sampler import Sampled
from minisgl.scheduler.stats import EngineStats

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 4}, "adult": {"type": "boolean"}},
    "required": ["name", "adult"],
}
COUNTERS = ("prefill_tokens", "prefill_decode_tokens", "decode_steps", "decode_tokens", "decode_kv_tokens")


@dataclass(frozen=True)
class Pass:
    batch: Batch
    prompt: int  # prompt tokens it computes
    later: int  # tokens after the prompt it computes
    before: EngineStats  # the stats just before it ran


def what_it_computes(batch: Batch, prompt_lens: dict[int, int]) -> tuple[int, int]:
    """(prompt tokens, tokens after the prompt) of a batch, from its positions; ``prompt_lens`` by page-table row."""
    prompt = later = 0
    for row, start, n in zip(batch.table_rows.tolist(), batch.prefix_lens.tolist(), batch.extend_lens.tolist()):
        in_prompt = max(0, min(start + n, prompt_lens[row]) - start)
        prompt, later = prompt + in_prompt, later + n - in_prompt
    return prompt, later


def test_every_pass_kind_is_booked_by_what_its_requests_computed(
    fresh_smollm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = fresh_smollm.scheduler
    assert sched.jump_forward
    chat = fresh_smollm.apply_chat_template([{"role": "user", "content": "Describe a person as JSON."}])
    # Its grammar compiled beforehand, so the request is admitted at once (compiles run off the loop).
    fresh_smollm.generate([chat], SamplingParams(max_tokens=1, json_schema=PERSON), use_tqdm=False)
    fresh_smollm.flush_cache()
    seen: list[Pass] = []
    forward = sched.runner.forward

    def recording(batch: Batch) -> Sampled:
        prompt, later = what_it_computes(batch, {r.row: r.prompt_len for r in sched.running})
        seen.append(Pass(batch, prompt, later, replace(sched.stats)))
        return forward(batch)

    monkeypatch.setattr(sched.runner, "forward", recording)
    capital = fresh_smollm.tokenizer.encode("The capital of France is")
    plain = sched.make_request(0, capital, SamplingParams(max_tokens=8, ignore_eos=True))
    person = sched.make_request(1, chat, SamplingParams(max_tokens=32, json_schema=PERSON))
    start = replace(sched.stats)
    kinds: set[str] = set()

    def check(last: Pass) -> None:
        """The pass just run: its attention by its shape, its stats by what its requests computed."""
        batch, before, after = last.batch, last.before, sched.stats
        grown = {name: getattr(after, name) - getattr(before, name) for name in COUNTERS}
        one_each = all(n == 1 for n in batch.extend_lens.tolist()) and batch.sample_rows.numel() == batch.num_reqs
        assert batch.attention is (AttentionKind.DECODE if one_each else AttentionKind.EXTEND)
        assert after.forward_passes == before.forward_passes + 1
        if last.prompt:
            kinds.add("prefill with decodes" if last.later else "prefill")
            expected = {"prefill_tokens": last.prompt, "prefill_decode_tokens": last.later}
            assert after.prefill_seconds > before.prefill_seconds and after.decode_seconds == before.decode_seconds
        else:
            kinds.add("decode" if one_each else "decode after a jump-forward")
            expected = {"decode_steps": 1, "decode_tokens": last.later, "decode_kv_tokens": int(batch.kv_lens.sum())}
            assert after.decode_seconds > before.decode_seconds and after.prefill_seconds == before.prefill_seconds
        assert grown == {**dict.fromkeys(COUNTERS, 0), **expected}

    sched.add(plain)
    sched.step()  # a prefill alone
    check(seen[-1])
    sched.add(person)  # its prefill carries the first request's decode along
    while sched.has_work:
        passes = len(seen)
        sched.step()
        if len(seen) > passes:  # a step may run none while a grammar works
            check(seen[-1])
    assert kinds == {"prefill", "prefill with decodes", "decode", "decode after a jump-forward"}
    assert person.finish_reason == "stop" and plain.finish_reason == "length"
    # Every token computed is booked once: as a prompt token, riding along a prefill, or in a decode step.
    total = sum(p.prompt + p.later for p in seen)
    booked = {f.name: getattr(sched.stats, f.name) - getattr(start, f.name) for f in fields(EngineStats)}
    assert booked["prefill_tokens"] + booked["prefill_decode_tokens"] + booked["decode_tokens"] == total
    assert booked["forward_passes"] == len(seen)
    assert booked["prefill_tokens"] == plain.prompt_len + person.prompt_len  # nothing was cached
