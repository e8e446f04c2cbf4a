"""kernels/greedy.py: the greedy argmax and the all-finite check of a batch of logits in one launch,
against torch's argmax and (logits < inf).all() (TRITON_INTERPRET=1 on CPU, CUDA on the GPU)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.greedy import BLOCK, greedy_argmax, greedy_argmax_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs CUDA or TRITON_INTERPRET=1")


def _rows(v: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(v)
    x = torch.randn(7, v, generator=g)
    x[1, :] = -float("inf")  # nothing allowed: index 0, ok
    x[1, v // 2] = 3.0 if v > 2 else x[1, v // 2]
    x[2, v - 1] = 50.0  # the max in the last (partial) part
    x[3, :] = 1.0  # all tied: the first index
    x[4, v // 3] = float("nan")  # not ok
    x[5, 0] = float("inf")  # not ok
    x[6, [v // 4, (3 * v) // 4]] = 9.0  # a tie across two parts: the first
    return x.to(DEV)


@pytest.mark.parametrize("v", [1, 5, BLOCK, 3 * BLOCK + 17])
def test_greedy_argmax_matches_torch(v: int) -> None:
    x = _rows(v)
    ids, ok = greedy_argmax(x)
    want_ids, want_ok = greedy_argmax_ref(x)
    assert ids.dtype == torch.int64 and ok.dtype == torch.bool
    assert ok.tolist() == want_ok.tolist()
    assert [i for i, good in zip(ids.tolist(), ok.tolist()) if good] == \
        [i for i, good in zip(want_ids.tolist(), want_ok.tolist()) if good]
    again, ok2 = greedy_argmax(x)  # the tickets were left zero: the same answer again
    assert torch.equal(again[ok2], ids[ok]) and torch.equal(ok2, ok)


def test_greedy_argmax_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="float32"):
        greedy_argmax(torch.zeros(2, 8, dtype=torch.float16, device=DEV))
    with pytest.raises(ValueError, match="contiguous"):
        greedy_argmax(torch.zeros(8, 2, device=DEV).T)
    ids, ok = greedy_argmax(torch.zeros(0, 8, device=DEV))
    assert ids.shape == (0,) and ok.shape == (0,)
