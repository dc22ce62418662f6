"""``python -m minisgl chat`` driven through a pseudo-terminal, as a person would use it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
from tiny_models import build_thinking_model

from minisgl.server.chat_shell import DIM, PLAIN

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


def test_a_thinking_models_reasoning_is_dimmed_and_left_out_of_the_history(tmp_path: Path) -> None:
    ask = "w10 w11 w12 w13"
    ids = build_thinking_model(tmp_path / "thinking", [{"role": "user", "content": ask}], 3, 12)
    words = [f"w{i}" for i in ids if i > 2]  # 0-2 are special: skipped
    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"}
    model = str(tmp_path / "thinking")
    cmd = ["-m", "minisgl", "chat", "--model", model, "--max-tokens", "12", "--quantization", "none"]
    shell = pexpect.spawn(sys.executable, cmd, env=env, encoding="utf-8", timeout=TIMEOUT_S, dimensions=(50, 200))
    try:
        shell.expect("you>")
        shell.sendline(ask)
        shell.expect("bot> ")
        shell.expect(STATS)
        assert shell.before.strip() == f"{DIM}{' '.join(words[:3])}{PLAIN}\r\n{' '.join(words[4:])}"
        prompt1 = int(shell.match.group(1))
        shell.expect("you>")
        shell.sendline("w20")
        shell.expect(STATS)
        # The history holds the answer's content alone: the first prompt, its 8 content words and the new one.
        assert int(shell.match.group(1)) == prompt1 - 1 + len(words[4:]) + 1 + 1, (prompt1, shell.match.group(1))
        shell.sendline("/exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
    assert shell.exitstatus == 0, shell.before
