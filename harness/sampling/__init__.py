"""The sampler: the laws actually sampled (warp) and the exact rejection rule on top of them."""

from harness.sampling.rejection import SAMPLERS, RejectionSampler, Verdict, get_sampler
from harness.sampling.warp import SamplingParams, draw, sample, warp

__all__ = ["SAMPLERS", "RejectionSampler", "SamplingParams", "Verdict", "draw", "get_sampler", "sample", "warp"]
