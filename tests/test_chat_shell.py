"""``python -m minisgl chat`` driven through a pseudo-terminal, as a person would use it."""

from __future__ import annotations

import os
import re
import sys

import pexpect

TIMEOUT_S = 120  # model load plus generation on two busy cores
STATS = re.compile(r"\[prompt (\d+) tokens, (\d+) cached; (\d+) generated")


def test_chat_shell_answers_and_reuses_the_cache() -> None:
    # No cursor-position requests: pexpect is not a terminal that answers them.
    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"}
    # The fp32 reference weights: their greedy answer is transformers' (the quantized default's prefill
    # runs bf16 products, where "Paris" and "L" are within 0.1% of each other for this question).
    cmd = ["-m", "minisgl", "chat", "--num-pages", "2048", "--max-tokens", "12", "--quantization", "none"]
    shell = pexpect.spawn(sys.executable, cmd, env=env, encoding="utf-8", timeout=TIMEOUT_S, dimensions=(50, 200))
    try:
        shell.expect("you>")
        shell.sendline("What is the capital of France?")
        shell.expect("bot> ")
        shell.expect(STATS)
        answer = shell.before
        prompt1, cached1, generated1 = map(int, shell.match.groups())
        assert "Paris" in answer
        assert cached1 == 0 and generated1 > 0

        shell.expect("you>")
        shell.sendline("And of Germany?")
        shell.expect(STATS)
        prompt2, cached2, _ = map(int, shell.match.groups())
        # The second prompt extends the first turn, which is in the cache.
        assert prompt2 > prompt1 and cached2 >= prompt1, (prompt1, prompt2, cached2)

        shell.expect("you>")
        shell.sendline("/reset")
        shell.expect(r"\[conversation reset\]")
        shell.expect("you>")
        shell.sendline("/exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
    assert shell.exitstatus == 0, shell.before
