"""`warp` (the one function that turns logits into the laws actually sampled) and `sample`."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectune.errors import SpectuneError
from spectune.sampling import RowSampling, SamplingParams, batch_sampling, draw, inverse_cdf, sample, select_rows, warp

LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


def test_temperature_scales_logits() -> None:
    for t in (0.5, 1.0, 2.0):
        expected = torch.softmax(LOGITS / t, -1)
        torch.testing.assert_close(warp(LOGITS, SamplingParams(temperature=t)), expected)


def test_top_k_keeps_the_k_largest_renormalised() -> None:
    out = warp(LOGITS, SamplingParams(top_k=2))
    torch.testing.assert_close(out, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_top_k_at_or_above_vocab_is_off() -> None:
    torch.testing.assert_close(warp(LOGITS, SamplingParams(top_k=4)), warp(LOGITS, SamplingParams()))


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    """Mass before tokens: 0, 0.5, 0.8, 0.95. top_p = 0.75 keeps the first two; 0.9 keeps three."""
    torch.testing.assert_close(warp(LOGITS, SamplingParams(top_p=0.75)), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    out = warp(LOGITS, SamplingParams(top_p=0.9))
    torch.testing.assert_close(out, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_top_p_always_keeps_the_first_token() -> None:
    torch.testing.assert_close(warp(LOGITS, SamplingParams(top_p=0.01)), torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_top_p_works_on_unsorted_batched_logits() -> None:
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    out = warp(logits, SamplingParams(top_p=0.75))
    torch.testing.assert_close(out[1], out[0].flip(0))


def test_mask_is_applied_before_normalisation() -> None:
    allowed = torch.tensor([False, True, True, True])
    torch.testing.assert_close(warp(LOGITS, SamplingParams(), allowed), torch.tensor([0.0, 0.6, 0.3, 0.1]))


def test_greedy_is_one_hot_on_the_allowed_argmax() -> None:
    greedy = SamplingParams(temperature=0)
    assert greedy.greedy
    torch.testing.assert_close(warp(LOGITS, greedy), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    allowed = torch.tensor([False, True, True, True])
    torch.testing.assert_close(warp(LOGITS, greedy, allowed), torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_warp_output_is_a_distribution() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 50, generator=gen) * 3
    for params in (SamplingParams(0.7, 10, 0.9), SamplingParams(1.3, 0, 0.5), SamplingParams(0.0)):
        out = warp(logits, params)
        assert out.dtype == torch.float32 and torch.all(out >= 0)
        torch.testing.assert_close(out.sum(-1), torch.ones(32))


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"temperature": -0.5}, "temperature=-0.5"),
    ({"temperature": math.nan}, "temperature=nan"),
    ({"temperature": math.inf}, "temperature=inf"),
    ({"temperature": True}, "temperature=True"),
    ({"top_p": True}, "top_p=True"),
    ({"top_k": -1}, "top_k=-1"),
    ({"top_k": 2.5}, "top_k=2.5"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"top_p": 1.5}, "top_p=1.5"),
])
def test_sampling_params_reject_bad_values(kwargs: dict, fragment: str) -> None:
    with pytest.raises(SpectuneError) as err:
        SamplingParams(**kwargs)
    assert fragment in str(err.value)


def test_sample_law_and_zero_entries() -> None:
    """n = 20000 rows of one law with zeros: zeros never drawn; |freq − p| ≤ 4.5 SE (SE ≤ 0.0036)."""
    probs = torch.tensor([0.0, 0.6, 1e-4, 0.0, 0.3999])
    n = 20_000
    draws = sample(probs.expand(n, -1), torch.Generator().manual_seed(1)).numpy()
    freq = np.bincount(draws, minlength=5) / n
    p = probs.double().numpy()
    assert freq[0] == 0 and freq[3] == 0
    assert np.all(np.abs(freq - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1e-12)


def test_sample_is_reproducible_with_a_generator() -> None:
    probs = torch.full((100, 10), 0.1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (100,)


ROW_SETTINGS = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
                SamplingParams(temperature=0.7, top_k=5, top_p=0.9), SamplingParams(temperature=0.7, top_p=0.8),
                SamplingParams(temperature=1.3, top_k=3), SamplingParams(temperature=0, top_k=4, top_p=0.5)]


@pytest.mark.parametrize("shape", [(6, 50), (6, 3, 50)], ids=["one-position", "three-positions"])
def test_per_row_settings_give_each_row_the_law_it_has_alone(shape: tuple[int, ...]) -> None:
    """A batch mixing greedy, T = 1, T = 0.7 with top-k/top-p, top-p alone and top-k alone: row b of the batched
    warp is, bit for bit, warp of row b alone with its own settings (at every position of a [B, n, V] block)."""
    logits = 3 * torch.randn(*shape, generator=torch.Generator().manual_seed(11))
    law = batch_sampling(ROW_SETTINGS)
    assert isinstance(law, RowSampling)
    batched = warp(logits, law)
    for row, settings in enumerate(ROW_SETTINGS):
        assert torch.equal(batched[row], warp(logits[row], settings)), settings
    assert torch.equal(batched[0].sum(-1), torch.ones(shape[1:-1]))  # greedy rows stay one-hot


def test_a_batch_that_shares_one_law_takes_the_one_law_path() -> None:
    """Rows that agree give back the shared SamplingParams itself (no per-row tensors); greedy rows agree whatever
    their top-k and top-p (the argmax ignores them); a selection of rows is again one law where they agree."""
    hot = SamplingParams(temperature=1.0)
    assert batch_sampling([hot, SamplingParams(temperature=1.0), hot]) is hot
    greedy = batch_sampling([SamplingParams(temperature=0), SamplingParams(temperature=0, top_k=4)])
    assert isinstance(greedy, SamplingParams) and greedy.greedy
    mixed = batch_sampling([hot, SamplingParams(temperature=0), hot])
    assert isinstance(mixed, RowSampling) and select_rows(mixed, [0, 2]) is hot
    assert select_rows(mixed, [1, 0]).rows == (SamplingParams(temperature=0), hot)
    assert select_rows(hot, [0, 5]) is hot


def test_per_row_draw_takes_the_argmax_on_greedy_rows_and_the_uniform_elsewhere() -> None:
    """Mixed rows share one draw: a greedy row's one-hot law gives its argmax for every uniform in [0, 1) (here
    0, 0.5 and 1 − 2⁻⁵³), a sampled row the inverse-CDF draw of its uniform."""
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(12))
    law = batch_sampling([SamplingParams(temperature=0), SamplingParams(temperature=1.0)] * 2)
    probs = warp(logits, law)
    for u in (0.0, 0.5, 1 - 2**-53):
        uniforms = torch.full((4,), u, dtype=torch.float64)
        drawn = draw(probs, law, uniforms=uniforms)
        assert drawn[0] == logits[0].argmax() and drawn[2] == logits[2].argmax()
        assert torch.equal(drawn[[1, 3]], inverse_cdf(probs[[1, 3]], uniforms[[1, 3]]))
