"""The per-step broadcast that makes every rank run rank 0's batch, with tensors only (no pickle).

Each message is a fixed-size int64 header over the control group (ranks 1..N-1 block on it while rank
0 idles), then for a forward pass one int64 payload over the default group, on the device:

    header   [op, attention kind, requests R, tokens T, sampled rows L, scored rows S, page-table entries E,
              prefill tokens]
    payload  input_ids[T] positions[T] out_slots[T] sample_rows[L] score_rows[S] table_rows[R] prefix_lens[R]
             extend_lens[R] page-table entries[E] (window-table entries[E])

That is the whole ``Batch`` but its sampling parameters and what its scored rows score (only rank 0
samples and scores). The entries are ``page_table[row, :prefix_len + extend_len]`` of every request in
the batch (then the same of the window table, for a model whose windowed layers have a pool of their
own), so a rank's tables hold rank 0's values for every slot the attention backend reads this step; the
KV slots themselves (which pages are free, cached, owned) are decided by rank 0 alone.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from minisgl.batch import AttentionKind, Batch
from minisgl.distributed.group import TPGroup
from minisgl.engine.engine import Engine
from minisgl.parallel.rendezvous import COLLECTIVE_TIMEOUT_S

OP_FORWARD, OP_CHECK, OP_SHUTDOWN = 1, 2, 3
HEADER_LEN = 8
REPORT_FIELDS = ("kv_heads", "num_slots", "slots_written", "written_checksum", "steps", "tokens")


class BatchSync:
    """This rank's side of the broadcast, over its ``engine``'s page table and pool."""

    def __init__(self, tp: TPGroup, engine: Engine) -> None:
        self.tp, self.engine = tp, engine
        self.page_table, self.device = engine.table.page_table, engine.device
        window_table = engine.table.window_table
        self.tables = [self.page_table] if window_table is None else [self.page_table, window_table]
        self.kv_heads = engine.pool.k.shape[2]
        # Every KV slot this rank has written: the same set on every rank, or the pools diverged.
        self.written = torch.zeros(engine.pool.num_slots, dtype=torch.bool, device=self.device)
        self.steps = self.tokens = 0
        self.is_ready = False  # every rank loaded and listens for headers

    # -- rank 0 ------------------------------------------------------------------------------------
    def send_batch(self, batch: Batch) -> None:
        kv_lens = batch.kv_lens
        tokens, sampled, scored = batch.input_ids.numel(), batch.sample_rows.numel(), batch.score_rows.numel()
        self._send_header(
            OP_FORWARD, batch.attention.value, batch.num_reqs, tokens, sampled, scored, int(kv_lens.sum()),
            batch.prefill_tokens,
        )  # fmt: skip
        meta = torch.cat([batch.table_rows, batch.prefix_lens, batch.extend_lens]).to(self.device)
        r_idx, c_idx = self._table_index(meta[: batch.num_reqs], kv_lens.to(self.device))
        entries = [table[r_idx, c_idx] for table in self.tables]
        rows = [batch.sample_rows, batch.score_rows.to(self.device)]
        payload = torch.cat([batch.input_ids, batch.positions, batch.out_slots, *rows, meta, *entries])
        dist.broadcast(payload, 0)
        self._record(batch.out_slots)

    def check(self) -> list[dict[str, int]]:
        """Every rank's report (see ``REPORT_FIELDS``), rank 0 first."""
        self._send_header(OP_CHECK)
        return self._report()

    def send_shutdown(self, timeout_s: float) -> None:
        self._send_header(OP_SHUTDOWN, timeout_s=timeout_s)

    def ready(self) -> None:
        """All ranks built their model and pool: a collective every rank reaches once loaded, which
        also checks that every pool has the same number of slots."""
        sizes = torch.tensor([self.written.numel(), -self.written.numel()], dtype=torch.int64, device=self.device)
        dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
        if int(sizes[0]) != -int(sizes[1]):
            raise RuntimeError(
                f"tensor-parallel ranks disagree on the KV pool size ({int(sizes[0])} vs {-int(sizes[1])} slots)"
            )
        self.is_ready = True

    # -- ranks 1..N-1 ------------------------------------------------------------------------------
    def serve(self) -> None:
        """Run rank 0's batches (their collectives pair with rank 0's) until it shuts the group down."""
        while (batch := self.recv()) is not None:
            self.engine.run_model(batch)

    def recv(self) -> Batch | None:
        """The next batch to run; None when rank 0 shuts the group down. Answers checks meanwhile."""
        while True:
            header = torch.zeros(HEADER_LEN, dtype=torch.int64)
            dist.broadcast(header, 0, group=self.tp.control)
            op, attention, num_reqs, tokens, sampled, scored, entries, prefill_tokens = header.tolist()
            if op == OP_SHUTDOWN:
                return None
            if op == OP_CHECK:
                self._report()
                continue
            if op != OP_FORWARD:
                raise RuntimeError(f"unknown tensor-parallel message {op}")
            sizes = [tokens, tokens, tokens, sampled, scored, num_reqs, num_reqs, num_reqs]
            sizes += [entries] * len(self.tables)
            payload = torch.empty(sum(sizes), dtype=torch.int64, device=self.device)
            dist.broadcast(payload, 0)
            input_ids, positions, out_slots, sample_rows, score_rows, rows, prefix_lens, extend_lens, *values = (
                payload.split(sizes)
            )
            index = self._table_index(rows, prefix_lens + extend_lens)
            for table, value in zip(self.tables, values):
                table[index] = value
            self._record(out_slots)
            return Batch(
                AttentionKind(attention), input_ids, positions, out_slots, rows.cpu(), prefix_lens.cpu(),
                extend_lens.cpu(), sample_rows, prefill_tokens=prefill_tokens, score_rows=score_rows.cpu(),
            )  # fmt: skip

    # -- both --------------------------------------------------------------------------------------
    def _send_header(self, *fields: int, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
        """Rank 0: a gloo send completes only once the peer receives, so the wait is bounded here
        (the control group's own timeout is for the receivers, which may idle for days)."""
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header[: len(fields)] = torch.tensor(fields, dtype=torch.int64)
        work = dist.broadcast(header, 0, group=self.tp.control, async_op=True)
        try:
            work.wait(timeout=timedelta(seconds=timeout_s))
        except RuntimeError as e:
            raise RuntimeError(
                f"sending to the tensor-parallel ranks failed (waited up to {timeout_s:g} s): {e}"
            ) from e

    def _table_index(self, rows: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of ``page_table[row, :len]`` for every (row, len), concatenated."""
        starts = torch.cumsum(lens, 0) - lens
        r_idx = torch.repeat_interleave(rows, lens)
        c_idx = torch.arange(r_idx.numel(), device=self.device) - torch.repeat_interleave(starts, lens)
        return r_idx, c_idx

    def _record(self, out_slots: torch.Tensor) -> None:
        self.written[out_slots] = True
        self.steps += 1
        self.tokens += out_slots.numel()

    def _report(self) -> list[dict[str, int]]:
        slots = torch.nonzero(self.written).flatten()
        checksum = int((slots * (slots + 7919)).sum()) if slots.numel() else 0
        mine = torch.tensor(
            [self.kv_heads, self.written.numel(), slots.numel(), checksum, self.steps, self.tokens],
            dtype=torch.int64,
            device=self.device,
        )
        if self.tp.rank != 0:
            dist.gather(mine, None, dst=0)
            return []
        parts = [torch.empty_like(mine) for _ in range(self.tp.size)]
        dist.gather(mine, parts, dst=0)
        return [dict(zip(REPORT_FIELDS, p.tolist())) for p in parts]
