"""Request slots and the page table that maps (request slot, position) → KV slot; with a window pool,
the window table maps them to the sliding-window layers' slots (``kvcache/window.py``)."""

from __future__ import annotations

import torch


class TableManager:
    """Hands out rows of the page table; a running request owns exactly one row."""

    def __init__(self, max_running_req: int, max_seq_len: int, device: torch.device, windowed: bool = False) -> None:
        self.page_table = torch.zeros((max_running_req, max_seq_len), dtype=torch.int64, device=device)
        self.window_table = torch.zeros_like(self.page_table) if windowed else None
        self._free_rows = list(range(max_running_req - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        if not self._free_rows:
            raise RuntimeError("no free request slot")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        self._free_rows.append(row)
