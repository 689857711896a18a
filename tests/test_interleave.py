"""Methods interleaved block by block (spectune/measure/interleave.py): the same work as whole runs, merged into
the same kind of point, with a policy's state carried across its blocks; the order; failures; the evaluate options."""

from __future__ import annotations

import itertools

import pytest

from policies.heuristic import HFHeuristic
from spectune.engine import Engine
from spectune.measure.interleave import block_order, blocks_of, merge_blocks, run_interleaved
from spectune.measure.point import measure_point
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

METHODS = [("ar", 0), ("fixed:gamma=3", 3), ("hf-heuristic", 2)]


@pytest.fixture(scope="module")
def engine(pair) -> Engine:
    target, draft = pair
    return Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                  device="cpu", seed=3)


def _policy(label: str, gamma: int):
    return HFHeuristic(gamma, max_gamma=6) if label == "hf-heuristic" else None


def _interleaved(engine, requests, size: int, carry: bool = True, repeats: int = 1):
    policies, calls = {}, []

    def block(label, gamma, repeat, index, part):
        calls.append((label, repeat, index))
        if index == 0 or not carry:
            policies[label, repeat] = _policy(label, gamma)
        return measure_point(engine, part, policies[label, repeat], label, gamma, concurrency=1, warmup=0,
                             max_context=None, reset_policy=index == 0 or not carry)

    return run_interleaved(METHODS, repeats, blocks_of(requests, size), block), calls


def _tokens(grid, label: str) -> dict[int, list[int]]:
    req = grid.frames()[0]
    mine = req[req["method"] == label]
    return {int(r): list(ids) for r, ids in zip(mine["request_id"], mine["output_ids"], strict=True)}


def _choices(cycles, label: str) -> list[tuple[int, int]]:
    mine = cycles[cycles["method"] == label].sort_values("cycle")
    return list(zip(mine["request_id"], mine["gamma"], strict=True))


def test_blocks_do_the_same_work_as_one_run_and_merge_into_one_point(engine):
    """6 requests (12 new tokens, T = 1) in blocks of 2 against one run each: every method's tokens are the same
    (keyed randomness), the hf-heuristic's γ choices too (its schedule is carried across blocks), and each
    (method, repeat) is one point whose duration is the sum of its blocks' and whose cycles are numbered once."""
    requests = random_requests(6, max_new=12)
    grid, calls = _interleaved(engine, requests, size=2)
    assert len(grid.points) == len(METHODS) and all(p["status"] == "ok" and p["blocks"] == 3 for p in grid.points)
    whole = {label: measure_point(engine, requests, _policy(label, g), label, g, concurrency=1, warmup=0,
                                  max_context=None) for label, g in METHODS}
    req, cyc = grid.frames()
    for label, _ in METHODS:
        one_req, one_cyc, _ = whole[label]
        assert _tokens(grid, label) == {int(r): list(i) for r, i in zip(one_req["request_id"], one_req["output_ids"],
                                                                        strict=True)}
        assert _choices(cyc, label) == list(zip(one_cyc["request_id"], one_cyc["gamma"], strict=True))
        point = next(p for p in grid.points if p["method"] == label)
        mine = req[req["method"] == label]
        assert point["completed"] == 6 and point["total_output_tokens"] == int(mine["output_tokens"].sum())
        spans = [mine[mine["request_id"].isin([r.request_id for r in blk])] for blk in blocks_of(requests, 2)]
        lengths = [float(s["finish_s"].max() - s["arrival_s"].min()) for s in spans]
        assert point["duration_s"] == pytest.approx(sum(lengths), rel=1e-9)
        # blocks follow one another on the merged clock: no block starts before the previous one ended
        assert all(float(b["arrival_s"].min()) >= float(a["finish_s"].max()) - 1e-9
                   for a, b in itertools.pairwise(spans))
        numbers = cyc[cyc["method"] == label]["cycle"]
        assert numbers.is_unique and list(numbers) == sorted(numbers)
    # every method ran block 0 before any ran block 1: the methods are interleaved, not run one after another
    assert [index for _, _, index in calls] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_resetting_the_policy_per_block_would_change_its_choices(engine):
    """The check above can fail: with the hf-heuristic restarted at every block (no state carried) its γ
    sequence differs from one run's on the same 6 requests in blocks of 1."""
    requests = random_requests(6, max_new=12)
    carried, _ = _interleaved(engine, requests, size=1)
    restarted, _ = _interleaved(engine, requests, size=1, carry=False)
    a, b = carried.frames()[1], restarted.frames()[1]
    assert _choices(a, "hf-heuristic") != _choices(b, "hf-heuristic")


def test_every_method_takes_every_place_and_follows_every_other_equally_often():
    """3 methods, 2 repeats of 3 blocks (6 orders, one full cycle of the odd-size Williams design): each method is
    first, second and third twice, and each ordered pair (a directly before b) occurs twice. A rotation balances
    the places but never the pairs: "ar" would always precede "fixed:gamma=3"."""
    places = {label: [0, 0, 0] for label, _ in METHODS}
    pairs: dict[tuple[str, str], int] = {}
    for repeat in range(2):
        for block in range(3):
            order = [label for label, _ in block_order(METHODS, repeat, block, 3)]
            for place, label in enumerate(order):
                places[label][place] += 1
            for a, b in itertools.pairwise(order):
                pairs[a, b] = pairs.get((a, b), 0) + 1
    assert places == {label: [2, 2, 2] for label, _ in METHODS}
    assert pairs == {(a, b): 2 for a, _ in METHODS for b, _ in METHODS if a != b}


@pytest.mark.parametrize("n", [2, 4, 5, 13])
def test_the_williams_design_balances_places_and_predecessors(n):
    from collections import Counter

    from spectune.measure.interleave import williams_orders

    orders = williams_orders(n)
    assert len(orders) == (n if n % 2 == 0 else 2 * n) and all(sorted(o) == list(range(n)) for o in orders)
    places = Counter((i, x) for o in orders for i, x in enumerate(o))
    pairs = Counter(p for o in orders for p in itertools.pairwise(o))
    assert len(set(places.values())) == 1 and len(places) == n * n
    assert len(set(pairs.values())) == 1 and len(pairs) == n * (n - 1)


def test_a_failing_block_fails_its_point_and_the_others_go_on(engine):
    requests = random_requests(4, max_new=6)

    def block(label, gamma, repeat, index, part):
        if label == "fixed:gamma=3" and index == 1:
            raise RuntimeError("out of memory (simulated on block 1)")
        return measure_point(engine, part, _policy(label, gamma), label, gamma, concurrency=1, warmup=0,
                             max_context=None)

    grid = run_interleaved(METHODS, 1, blocks_of(requests, 2), block)
    status = {p["method"]: p["status"] for p in grid.points}
    assert status == {"ar": "ok", "fixed:gamma=3": "failed", "hf-heuristic": "ok"}
    failed = next(p for p in grid.points if p["status"] == "failed")
    assert failed["error"] == "RuntimeError: out of memory (simulated on block 1)"
    assert set(grid.frames()[0]["method"]) == {"ar", "hf-heuristic"}  # no half point among the rows


def test_a_run_that_keeps_the_policy_refuses_a_warm_up(engine):
    with pytest.raises(ValueError, match="warm-up"):
        measure_point(engine, random_requests(1, max_new=4), HFHeuristic(2, 4), "hf", 2, concurrency=1, warmup=1,
                      max_context=None, reset_policy=False)


def test_merge_combines_the_conditions_of_its_windows(engine):
    requests = random_requests(2, max_new=4)
    parts = []
    for share, wall in ((0.0, 1.0), (0.3, 3.0)):
        req, cyc, summary = measure_point(engine, requests[:1] if not parts else requests[1:], None, "ar", 0,
                                          concurrency=1, warmup=0, max_context=None)
        parts.append((req, cyc, {**summary, "conditions": {"wall_s": wall, "others_cpu_share": share,
                                                           "steal_share": 0.0, "load1_start": 0.5 + share,
                                                           "load1_end": 1.0 + share, "gpu_others_util": None}}))
    merged = merge_blocks(parts)[2]["conditions"]
    assert merged["others_cpu_share"] == pytest.approx(0.225)  # (0·1 + 0.3·3) / 4
    assert merged["wall_s"] == 4.0 and merged["load1_start"] == 0.5 and merged["load1_end"] == 1.3
    assert merged["windows"] == 2


@pytest.mark.parametrize(("override", "message"), [
    ("evaluate.block_prompts=3", "evaluate.block_prompts=3 is invalid with evaluate.concurrency=[1, 4]"),
    ("evaluate.block_prompts=0", "evaluate.block_prompts=0"),
    ("evaluate.noise_floor=maybe", "evaluate.noise_floor='maybe' is invalid"),
])
def test_bad_interleave_options_fail_in_one_line(override, message):
    from hydra import compose, initialize_config_dir

    from policies.evaluate.pipeline import EvaluateSettings
    from spectune.errors import SpectuneError
    from spectune.run import cli
    from tests.conftest import REPO

    with pytest.raises(SpectuneError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cli.check_keys_exist(["task=evaluate", override])  # a value of the wrong type: the schema, as Hydra composes
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["task=evaluate", override])
        EvaluateSettings.from_cfg(cfg)


def test_a_block_size_that_every_concurrency_divides_is_accepted():
    from hydra import compose, initialize_config_dir

    from policies.evaluate.pipeline import EvaluateSettings
    from tests.conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["task=evaluate", "evaluate.block_prompts=8",
                                                       "evaluate.noise_floor=true"])
    settings = EvaluateSettings.from_cfg(cfg)
    assert settings.block_prompts == 8 and settings.noise_floor


def test_block_size_is_one_rule_for_bench_and_evaluate():
    """null stays null; a size every concurrency divides passes (an integral float too, as every integer option);
    anything else fails in one line naming the value and the concurrency that does not divide it."""
    from spectune.errors import SpectuneError
    from spectune.measure.interleave import block_size

    assert block_size(None, "task.block_prompts", [2], "concurrency=2") is None
    assert block_size(8, "evaluate.block_prompts", [1, 2, 4, 8], "evaluate.concurrency=[1, 2, 4, 8]") == 8
    assert block_size(4.0, "task.block_prompts", [2], "concurrency=2") == 4
    with pytest.raises(SpectuneError, match=r"task.block_prompts=3 is invalid with concurrency=2: .*\(not of 2\)"):
        block_size(3, "task.block_prompts", [2], "concurrency=2")
    for bad in (0, 2.5, "four", True):
        with pytest.raises(SpectuneError, match=r"task\.block_prompts="):
            block_size(bad, "task.block_prompts", [1], "concurrency=1")


def test_a_run_of_one_prompt_blocks_shows_one_progress_line_not_a_bar_per_block(engine, capsys):
    """3 methods x 2 repeats x 6 prompts, each prompt a block: 36 blocks. Stderr (not a terminal here) gets the run's
    one progress line, at most 10 + elapsed / LOG_EVERY_S lines (spectune.run.progress), the last with every point and
    request done, and no carriage return (no bar)."""
    import time

    from spectune.engines.spectune import SpectuneEngine
    from spectune.measure.interleave import as_method, run_design
    from spectune.run.progress import LOG_EVERY_S

    measured = SpectuneEngine(engine, lambda method: _policy(method.label, method.gamma), max_context=None)
    start = time.monotonic()
    grid = run_design(measured, random_requests(6, max_new=4), [as_method(label, g) for label, g in METHODS], 2,
                      block_prompts=1, concurrency=1, warmup=0)
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line]
    assert len(grid.points) == 6 and "\r" not in err
    assert all(line.startswith("measuring: ") for line in lines) and 1 <= len(lines) <= 10 + elapsed / LOG_EVERY_S
    assert lines[-1].startswith("measuring: points 6/6, requests 36/36 (100%), elapsed ")
