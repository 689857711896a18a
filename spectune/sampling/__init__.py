"""The sampler: the laws actually sampled (warp) and the exact rejection rule on top of them."""

from spectune.sampling.rejection import SAMPLERS, RejectionSampler, Verdict, get_sampler
from spectune.sampling.warp import SamplingParams, draw, inverse_cdf, sample, warp

__all__ = ["SAMPLERS", "RejectionSampler", "SamplingParams", "Verdict", "draw", "get_sampler", "inverse_cdf", "sample",
           "warp"]
