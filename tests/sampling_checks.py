"""Shared checks of the sampling tests (CPU interpreter and GPU shapes)."""
from __future__ import annotations

import torch

from treadle.kernels.sampling import SamplingBatch, kept_threshold_ref


def in_kept_set(s: torch.Tensor, tok: torch.Tensor, batch: SamplingBatch, rtol: float) -> torch.Tensor:
    """bool [B]: token inside the exact kept set of its row (kept_threshold_ref), or outside it
    only by a top-p boundary that fp32 summation order legitimately decides either way: the
    token's strictly-greater mass within ``rtol * Z`` of ``top_p * Z``. The kernel sums the
    masses in its own lane order (and, compiled, with an approximate exp), the reference in
    sorted order, so a token sitting exactly on the boundary may be kept by one only."""
    tau = kept_threshold_ref(s, batch.top_ks, batch.top_ps, batch.min_ps)
    st = s.gather(1, tok[:, None]).squeeze(1)
    inside = st >= tau
    sd = s.double()
    B, V = s.shape
    kth = sd.sort(-1, descending=True).values.gather(1, (batch.top_ks.clamp(1, V) - 1).long()[:, None])
    use_k = ((batch.top_ks > 0) & (batch.top_ks < V))[:, None]
    base = torch.where(use_k, kth.clamp_min(-40.0), torch.full_like(kth, -40.0))
    z = torch.where(sd >= base, sd.exp(), 0.0).sum(-1)
    above = torch.where(sd > st.double()[:, None], sd.exp(), 0.0).sum(-1)
    edge = (above - batch.top_ps.double() * z).abs() <= rtol * z
    # only top-p may be undecided: the token must pass every other filter exactly
    others = kept_threshold_ref(s, batch.top_ks, torch.ones_like(batch.top_ps), batch.min_ps)
    return inside | (edge & (st >= others) & (st >= -40.0))
