"""Hugging Face transformers ``generate``: no cache across requests, so every prompt is prefilled in full."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from benchmarks.systems.base import Completion, SystemOptions


class HFSystem:
    def __init__(self, name: str, opts: SystemOptions, batch_size: int) -> None:
        self.name = name
        self.batch_size = batch_size
        self.description = f"transformers generate, batch size {batch_size}" + (
            " (left-padded)" if batch_size > 1 else ""
        )
        torch.set_num_threads(opts.threads)
        device = opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(opts.hf_folder, dtype=getattr(torch, opts.dtype))
        self.model.to(self.device).eval()  # type: ignore[arg-type]  # transformers types .to oddly
        tokenizer = AutoTokenizer.from_pretrained(opts.hf_folder)
        # Padding only ever sits left of real tokens under a zero mask, so any id works; EOS is always there.
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # Like ignore_eos elsewhere: EOS may be generated but does not end the sequence. (min_new_tokens
        # would forbid EOS instead, changing the greedy tokens wherever EOS is the argmax.)
        self.model.generation_config.eos_token_id = None

    def generate(self, prompts: list[list[int]], output_len: int) -> list[Completion]:
        config = GenerationConfig(max_new_tokens=output_len, do_sample=False, pad_token_id=self.pad_id)
        completions = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start : start + self.batch_size]
            width = max(map(len, batch))
            ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in batch], device=self.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=self.device)
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            completions += [Completion(row[width:].tolist(), 0) for row in out]
        return completions

    def reset(self) -> None:
        """Nothing persists between ``generate`` calls."""

    def close(self) -> None:
        del self.model
