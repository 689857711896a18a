"""The sampler: the laws actually sampled (warp) and the exact rejection rule on top of them."""

from spectune.sampling.rejection import SAMPLERS, RejectionSampler, Verdict, get_sampler
from spectune.sampling.warp import (
    RowSampling,
    SamplingParams,
    batch_sampling,
    draw,
    inverse_cdf,
    sample,
    select_rows,
    warp,
)

__all__ = ["SAMPLERS", "RejectionSampler", "RowSampling", "SamplingParams", "Verdict", "batch_sampling", "draw",
           "get_sampler", "inverse_cdf", "sample", "select_rows", "warp"]
