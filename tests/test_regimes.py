"""Regimes in a workload (workloads/regimes.py): a seeded per-request sampling mix and phases, composed by Hydra,
loaded with the tiny tokenizer, and every bad value a one-line error before any model loads."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hydra import compose, initialize_config_dir

from spectune.errors import SpectuneError
from spectune.measure.point import requests_of
from spectune.models.loading import REPO_ROOT
from spectune.sampling import SamplingParams
from workloads.loader import load_workload
from workloads.regimes import SamplingShare, check_regimes, draw_settings, refuse_phases

HALF = "workload.sampling_mix=[{temperature:0,share:0.5},{temperature:1.0,share:0.5}]"
SIX = ["chat", "summarise", "qa", "translate", "rewrite", "code"]


def composed(*overrides: str):
    """The config of ``overrides``; ``+workload=en`` on its dialogue lines (16 of them unless the overrides say how
    many), which these tests' counts assume (the bundled workloads' default is the six built categories)."""
    if "+workload=en" in overrides:
        lines = ["workload.categories=[chat-lines]"]
        lines += [] if any(o.startswith("workload.num_prompts=") for o in overrides) else ["workload.num_prompts=16"]
        overrides = (*overrides, *lines)
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_shares_are_met_exactly_in_a_seeded_order() -> None:
    """Largest remainder: 10 requests at 0.5 / 0.3 / 0.2 are 5 / 3 / 2, 7 at 0.5 / 0.5 are 4 / 3 (ties to the
    earlier entry); the order is a shuffle keyed by its key: the same key the same order, another key another."""
    a, b, c = SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=0.7)
    mix = [SamplingShare(a, 0.5), SamplingShare(b, 0.3), SamplingShare(c, 0.2)]
    drawn = draw_settings(10, mix, "1:sampling")
    assert Counter(drawn) == {a: 5, b: 3, c: 2}
    assert drawn == draw_settings(10, mix, "1:sampling") and drawn != draw_settings(10, mix, "2:sampling")
    assert Counter(draw_settings(7, [*mix[:1], SamplingShare(b, 0.5)], "k")) == {a: 4, b: 3}


def test_a_sampling_mix_gives_each_request_its_settings_and_the_records_carry_them(tokenizer) -> None:
    """16 chat lines at greedy / T = 1 half and half: 8 each, top-k and top-p from workload.sampling unless an entry
    gives its own; the same config gives the same assignment; the requests carry it; the metadata declares it."""
    wl = load_workload(composed("+workload=en", HALF, "workload.sampling.top_p=0.9").workload, tokenizer)
    temperatures = Counter(p.sampling.temperature for p in wl.prompts)
    assert temperatures == {0: 8, 1.0: 8} and {p.sampling.top_p for p in wl.prompts} == {0.9}
    again = load_workload(composed("+workload=en", HALF, "workload.sampling.top_p=0.9").workload, tokenizer)
    assert [p.sampling for p in again.prompts] == [p.sampling for p in wl.prompts]
    assert [r.sampling for r in requests_of(wl.prompts, 8)] == [p.sampling for p in wl.prompts]
    assert wl.describe()["sampling_mix"] == [{"temperature": 0, "top_k": 0, "top_p": 0.9, "share": 0.5},
                                             {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "share": 0.5}]
    plain = load_workload(composed("+workload=en").workload, tokenizer)
    assert all(p.sampling is None and p.phase is None for p in plain.prompts)
    assert "sampling_mix" not in plain.describe() and "phases" not in plain.describe()
    assert [p.id for p in plain.prompts] == [p.id for p in wl.prompts]  # the same prompts either way


def test_the_shifting_workload_is_four_phases_of_six_tasks_in_equal_budgets(tokenizer) -> None:
    """shift-en on the tiny pair (short profile: 128 new tokens): four phases of 3072 tokens, 24 fresh prompts each,
    every category 4 times in each, greedy / T = 1 / greedy / T = 1 at concurrency 1, 1, 4, 4, in the listed order;
    shift-it is the same in Italian."""
    wl = load_workload(composed("+workload=shift-en").workload, tokenizer)
    assert wl.max_new_tokens == 128 and len(wl.prompts) == 96 and len({p.id for p in wl.prompts}) == 96
    phases = list(dict.fromkeys(p.phase for p in wl.prompts))
    assert phases == ["greedy-c1", "t1-c1", "greedy-c4", "t1-c4"]
    for name, temperature in zip(phases, (0, 1.0, 0, 1.0), strict=True):
        mine = [p for p in wl.prompts if p.phase == name]
        assert len(mine) == 24 and Counter(p.category for p in mine) == dict.fromkeys(SIX, 4)
        assert {p.sampling.temperature for p in mine} == {temperature}
    described = wl.describe()
    assert described["phase_order"] == "listed"
    assert [(p["name"], p["concurrency"], p["token_budget"]) for p in described["phases"]] == [
        ("greedy-c1", 1, 3072), ("t1-c1", 1, 3072), ("greedy-c4", 4, 3072), ("t1-c4", 4, 3072)]
    italian = load_workload(composed("+workload=shift-it").workload, tokenizer)
    assert italian.language == "it" and {p.language for p in italian.prompts} == {"it"}
    assert [p.phase for p in italian.prompts] == [p.phase for p in wl.prompts]


def test_a_shuffled_phase_order_is_seeded_and_recorded(tokenizer) -> None:
    """phase_order=shuffled: the order is a shuffle keyed by workload.seed (the same seed, the same order), run and
    recorded in that order; each phase keeps its own settings and concurrency."""
    orders = {}
    for seed in (1, 2, 3, 4):
        node = composed("+workload=shift-en", "workload.phase_order=shuffled", f"workload.seed={seed}").workload
        orders[seed] = [p.name for p in check_regimes(node).phases]
        assert orders[seed] == [p.name for p in check_regimes(node).phases]
    assert len({tuple(o) for o in orders.values()}) > 1 and all(sorted(o) == sorted(orders[1]) for o in
                                                                orders.values())
    node = composed("+workload=shift-en", "workload.phase_order=shuffled", "workload.seed=2").workload
    wl = load_workload(node, tokenizer)
    assert list(dict.fromkeys(p.phase for p in wl.prompts)) == orders[2] == [p["name"] for p in
                                                                             wl.describe()["phases"]]
    assert {p.sampling.temperature for p in wl.prompts if p.phase == "t1-c4"} == {1.0}


def test_phases_and_mixes_compose_in_a_sweep() -> None:
    """Hydra's sweep syntax reaches the new keys: a choice of mixes and of phase orders, each its own job."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    (mixes,) = parser.parse_overrides([
        "workload.sampling_mix=[{temperature:0,share:1.0}],[{temperature:0,share:0.5},{temperature:1.0,share:0.5}]"])
    jobs = list(mixes.sweep_string_iterator())
    assert len(jobs) == 2
    for job in jobs:
        node = composed("+workload=en", f"workload.sampling_mix={job}").workload
        assert sum(s.share for s in check_regimes(node).mix) == pytest.approx(1.0)


@pytest.mark.parametrize("overrides, message", [
    (["+workload=en", "workload.sampling_mix=[{temperature:0,share:0.5}]"], "shares sum to 0.5: they must sum to 1"),
    (["+workload=en", "workload.sampling_mix=[{temperature:0,share:1.0,top_n:3}]"],
     "workload.sampling_mix[0].top_n is not a key of a mix entry"),
    (["+workload=en", "workload.sampling_mix=[{temperature:-1,share:1.0}]"],
     "workload.sampling_mix[0]: temperature=-1 is invalid"),
    (["+workload=en", "workload.sampling_mix=[{share:1.0}]"], "give temperature and share"),
    (["+workload=shift-en", "workload.num_prompts=8"], "workload.num_prompts=8 is invalid with workload.phases"),
    (["+workload=shift-en", "workload.phase_order=random"], "workload.phase_order='random' is invalid"),
    (["+workload=en", "workload.num_prompts=null", "workload.phases=[{name:a,concurrency:0,token_budget:8}]"],
     "workload.phases[0].concurrency=0 is invalid"),
    (["+workload=en", "workload.num_prompts=null", "workload.phases=[{name:a,concurrency:1}]"],
     "workload.phases[0].token_budget is missing"),
    (["+workload=en", "workload.num_prompts=null",
      "workload.phases=[{name:a,concurrency:1,token_budget:8,categories:[code]}]"],
     "workload.phases[0].categories=['code']"),
    (["+workload=en", "workload.num_prompts=null",
      "workload.phases=[{name:a,concurrency:1,token_budget:8},{name:a,concurrency:2,token_budget:8}]"],
     "has the name 'a' twice"),
])
def test_bad_regimes_are_one_line_errors_before_any_model(overrides, message) -> None:
    with pytest.raises(SpectuneError, match=re.escape(message)) as err:
        check_regimes(composed(*overrides).workload)
    assert "\n" not in str(err.value)


def test_a_phase_that_asks_for_more_prompts_than_the_workload_has_is_one_line(tokenizer) -> None:
    phases = "workload.phases=[{name:long,concurrency:1,token_budget:100000}]"
    with pytest.raises(SpectuneError, match=r"phase 'long' needs 2084 prompts of chat-lines \(token_budget "
                       r"100000 / max_new_tokens 48\), the workload has \d+ left") as err:
        load_workload(composed("+workload=en", "workload.num_prompts=null", phases).workload, tokenizer)
    assert "\n" not in str(err.value)


def test_tasks_other_than_bench_refuse_phases_in_one_line() -> None:
    message = "workload.phases is run by task=bench only, not by task=trace"
    with pytest.raises(SpectuneError, match=re.escape(message)):
        refuse_phases(composed("+workload=shift-en").workload, "task=trace")
    refuse_phases(composed("+workload=en", HALF).workload, "task=trace")  # a mix alone is fine everywhere
