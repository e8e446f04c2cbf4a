"""A fake model runner that isolates the Scheduler from any real model.

The fake keeps its own per-slot "KV": for every slot the scheduler asks it to write, it
records (position, token id, chain hash), where the chain hash folds in every earlier token
of the sequence, like real KV depends on the whole prefix. Before computing logits it walks
the request's slots through `req_to_token[row, :seq_len]` and asserts that each holds the
right position and a hash consistent with the slot before it. So a cache hit on wrong slots,
a stale slot reused after eviction, or a slot overwritten by another request fails loudly
instead of silently producing a plausible token.

The greedy next token is a pure function of the token sequence (`next_token`), so the
reference output of a request is computable without any scheduler (`reference_greedy`).

    logits[t] = -0.01 * ((t - next) mod V)   # next is the argmax, next+1 the runner-up, ...
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from treadle.radix_cache import ReqToTokenPool, TokenSlotAllocator
from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.forward_batch import ForwardBatch, ForwardMode
from treadle.runtime.io_struct import ReqOutput, TokenizedGenerateReq
from treadle.runtime.model_config import DUMMY_CONFIGS
from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.scheduler import Scheduler

VOCAB = 64
EOS = 2
FIRST_NORMAL = 3  # ids 0..2 are never produced by the hash rule (EOS only via eos_at_len)
_MOD = (1 << 61) - 1
_SEED = 1469598103934665603 % _MOD


def chain(prev: int, token: int) -> int:
    """Hash of a sequence extended by one token (stands in for the KV of that position)."""
    return (prev * 1000003 + token * 7919 + 17) % _MOD


def next_token(h: int, length: int, eos_at_len: frozenset[int] | set[int] = frozenset()) -> int:
    """Greedy next token after a sequence of `length` tokens whose chain hash is `h`."""
    if length in eos_at_len:
        return EOS
    return h % (VOCAB - FIRST_NORMAL) + FIRST_NORMAL


def logits_row(nxt: int) -> torch.Tensor:
    t = torch.arange(VOCAB)
    return -0.01 * ((t - nxt) % VOCAB).float()


class StepRecord(NamedTuple):
    mode: ForwardMode
    rows: list[int]  # req_to_token rows in the batch
    prefix_lens: list[int]
    extend_lens: list[int]  # tokens computed per request this step
    num_logits: int


class FakeRunner:
    def __init__(self, num_slots: int = 1024, max_running: int = 16, context_len: int = 256,
                 eos_at_len: set[int] | None = None) -> None:
        self.config = dataclasses.replace(DUMMY_CONFIGS["tiny-llama"], vocab_size=VOCAB, eos_token_ids=(EOS,))
        self.context_len = context_len
        self.allocator = TokenSlotAllocator(num_slots, debug=True)
        self.max_running = max_running
        self.req_to_token_pool = ReqToTokenPool(max_running + 1, context_len + 8)
        self.device = torch.device("cpu")
        self.eos_at_len = set(eos_at_len or ())
        self.kv: dict[int, tuple[int, int, int]] = {}  # slot -> (position, token, chain hash)
        self.steps: list[StepRecord] = []

    @property
    def computed_tokens(self) -> int:
        return sum(sum(s.extend_lens) for s in self.steps)

    def _checked_hash(self, row: int, upto: int) -> int:
        """Walk slots 0..upto-1 of `row`, asserting each holds its position and a consistent
        chain; returns the chain hash of the first `upto` tokens."""
        r2t = self.req_to_token_pool.req_to_token
        slots = r2t[row, :upto].tolist()
        assert len(set(slots)) == len(slots), f"row {row} maps two positions to one slot: {slots}"
        h = _SEED
        for q, s in enumerate(slots):
            assert s != 0, f"row {row} position {q} points at the dummy slot 0"
            assert s in self.kv, f"row {row} position {q} reads slot {s}, never written"
            pos, tok, hh = self.kv[s]
            assert pos == q, f"row {row} position {q} reads slot {s} written for position {pos}"
            h = chain(h, tok)
            assert hh == h, f"row {row} position {q} reads slot {s} whose KV belongs to another prefix"
        return h

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        r2t = self.req_to_token_pool.req_to_token
        ids, pos, loc = fb.input_ids.tolist(), fb.positions.tolist(), fb.out_cache_loc.tolist()
        rows, prefix = fb.req_pool_indices.tolist(), fb.prefix_lens.tolist()
        ext, starts = fb.extend_lens.tolist(), fb.extend_start_loc.tolist()
        assert len(ids) == len(pos) == len(loc) == sum(ext)
        assert len(set(loc)) == len(loc), "one step writes the same slot twice"
        assert len(set(rows)) == len(rows), "a request row appears twice in one batch"
        if fb.mode == ForwardMode.DECODE:
            assert ext == [1] * len(rows)
        hashes: list[int] = [0] * len(ids)  # chain hash of the sequence ending at each flat token
        for b, row in enumerate(rows):
            start, n, p = starts[b], ext[b], prefix[b]
            assert n >= 1
            assert r2t[row, p: p + n].tolist() == loc[start: start + n], "req_to_token disagrees with out_cache_loc"
            h = self._checked_hash(row, p)
            for i in range(start, start + n):
                q = p + (i - start)
                assert pos[i] == q, f"token {i} has position {pos[i]}, expected {q}"
                assert 0 <= ids[i] < VOCAB
                h = chain(h, ids[i])
                self.kv[loc[i]] = (q, ids[i], h)
                hashes[i] = h
        out = []
        for i in fb.logits_indices.tolist():
            out.append(logits_row(next_token(hashes[i], pos[i] + 1, self.eos_at_len)))
        self.steps.append(StepRecord(fb.mode, rows, prefix, ext, len(out)))
        return torch.stack(out) if out else torch.empty(0, VOCAB)


# ---------------------------------------------------------------------- driving helpers


def make_scheduler(runner: FakeRunner | None = None, recover: bool = False, **args) -> tuple[Scheduler, FakeRunner]:
    """A scheduler over `runner`. Step recovery is off unless `recover`: an assertion of the
    fake (a scheduler bug) must fail the test, not become an error output."""
    runner = runner or FakeRunner()
    sched = Scheduler(EngineArgs(**args), runner, None)
    sched.recover_step_errors = recover
    return sched, runner


def greedy(max_new_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **kw)


def req(rid: str, ids: list[int], params: SamplingParams, **kw) -> TokenizedGenerateReq:
    return TokenizedGenerateReq(rid, list(ids), params, **kw)


def drain(sched: Scheduler, check_each_step: bool = False, max_steps: int = 100_000) -> list[ReqOutput]:
    """Step until idle; returns every output, including ones queued while idle (rejections)."""
    outs: list[ReqOutput] = []
    steps = 0
    while sched.has_work():
        outs += sched.step()
        if check_each_step:
            sched.check_integrity()
        steps += 1
        assert steps < max_steps, "scheduler does not make progress"
    outs += sched.step()  # idle step: flushes outputs and runs the idle integrity check
    return outs


def collect(outs: list[ReqOutput]) -> dict[str, tuple[list[int], ReqOutput]]:
    """rid -> (all output ids in order, the final output). Asserts each rid finishes once and
    emits nothing after finishing."""
    res: dict[str, tuple[list[int], ReqOutput | None]] = {}
    for o in outs:
        ids, fin = res.get(o.rid, ([], None))
        assert fin is None, f"{o.rid} emitted output after finishing"
        ids = ids + list(o.new_ids)
        res[o.rid] = (ids, o if o.finished is not None else None)
    for rid, (_, fin) in res.items():
        assert fin is not None, f"{rid} never finished"
    return res  # type: ignore[return-value]


def reference_greedy(prompt: list[int], max_new_tokens: int, *, context_len: int = 256,
                     eos_at_len: set[int] | None = None, min_new_tokens: int = 0,
                     stop_token_ids: tuple[int, ...] = (), ignore_eos: bool = False) -> list[int]:
    """What a correct scheduler must output for a greedy request, computed with no scheduler."""
    eos_at = set(eos_at_len or ())
    h = _SEED
    for t in prompt:
        h = chain(h, t)
    seq_len, out = len(prompt), []
    while len(out) < max_new_tokens:
        # min_new_tokens masks stop tokens: the runner-up (next + 1) wins instead
        t = next_token(h, seq_len, eos_at)
        stops = set(stop_token_ids) | (set() if ignore_eos else {EOS})
        if len(out) < min_new_tokens:
            while t in stops:
                t = (t + 1) % VOCAB
        out.append(t)
        h, seq_len = chain(h, t), seq_len + 1
        if len(out) >= min_new_tokens and t in stops:
            break
        if seq_len >= context_len:
            break
    return out
