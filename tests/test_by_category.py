"""Per-category tables (spectune.stats.by_category): every request carries its category into requests.parquet, and a
run of several categories is broken down per (method, category) in rows that add up to the overall row, on a real tiny
run. Run directories written while the category was called a task read with the new names."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from analysis.load import load_requests
from analysis.report import build
from spectune.run import rundir
from spectune.stats.by_category import ALL, SUMS, alpha_by_category, by_category, durations_of, several_categories
from tests.conftest import run_composed

MIXED = ["+workload=en", "workload.categories=[chat-lines,qa]", "workload.num_prompts=4", "workload.max_new_tokens=8",
         "workload.task_max_new_tokens=8", "task.warmup=1", "task.repeats=2", "gamma=[2]"]


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """A real bench run of two categories (chat lines and qa, interleaved) on the tiny pair: AR and γ = 2, two
    repeats."""
    return run_composed(tmp_path_factory.mktemp("mixed") / "run", *MIXED)


def test_requests_record_their_category_in_workload_order(mixed_run):
    requests = rundir.REQUESTS.read(mixed_run)
    first = requests[(requests["method"] == "ar") & (requests["repeat"] == 0)].sort_values("request_id")
    assert first["category"].tolist() == ["chat-lines", "qa"] * 2


def test_category_rows_add_up_to_the_overall_row_whose_rates_come_from_the_sums(mixed_run):
    summary = rundir.SUMMARY.read(mixed_run)
    table = pd.DataFrame(summary["by_category"])
    assert set(table["category"]) == {"chat-lines", "qa", ALL}
    requests, cycles = rundir.REQUESTS.read(mixed_run), rundir.CYCLES.read(mixed_run)
    durations = durations_of(summary["points"])
    methods = {m["method"]: m for m in summary["methods"]}
    for method, rows in table.groupby("method"):
        parts, overall = rows[rows["category"] != ALL], rows[rows["category"] == ALL].iloc[0]
        for key in SUMS:
            assert parts[key].sum() == overall[key], (method, key)  # exactly: the overall row is their sum
        assert overall["output_throughput"] == overall["output_tokens"] / overall["wall_s"]
        assert overall["decode_throughput"] == overall["decode_tokens"] / overall["decode_s"]
        assert parts["token_share"].sum() == pytest.approx(1.0) and parts["time_share"].sum() == pytest.approx(1.0)
        mine = requests[requests["method"] == method]
        assert overall["output_tokens"] == mine["output_tokens"].sum() and overall["requests"] == len(mine) == 8
        # wall seconds are each request's share of its run: they add up to the runs' measured durations
        assert overall["wall_s"] == pytest.approx(sum(d for (m, _), d in durations.items() if m == method))
        # the overall speed-up is the run's own comparison, interval and all
        assert overall["speedup"] == pytest.approx(methods[method]["speedup"])
        if method != "ar":
            spec = cycles[(cycles["method"] == method) & (cycles["num_drafts"] > 0)]
            assert overall["acceptance_length"] == pytest.approx(1 + spec["accepted"].sum() / len(spec))
            assert overall["speedup_ci95_lo"] == pytest.approx(methods[method]["speedup_ci95_lo"])
            assert all(r["speedup_ci95_lo"] <= r["speedup"] <= r["speedup_ci95_hi"] for r in rows.to_dict("records"))
        else:
            assert (rows["speedup"] == 1.0).all() and rows["acceptance_length"].isna().all()


def test_the_summary_says_what_the_target_answered_per_category(mixed_run):
    answers = rundir.SUMMARY.read(mixed_run)["answers_by_category"]
    assert [(a["language"], a["category"]) for a in answers] == [("en", "chat-lines"), ("en", "qa")]
    assert all(a["requests"] == 2 and a["stop"] + a["length"] <= 1 for a in answers)


def test_the_report_shows_the_per_category_table(mixed_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(mixed_run, copy)
    summary = rundir.SUMMARY.read(copy)
    del summary["by_category"]  # recomputed from the records where the summary lacks it
    rundir.SUMMARY.write(copy, summary)
    text = build(copy).read_text()
    assert "Per category (Spec-Bench style" in text and "| fixed:gamma=2 | qa |" in text


def test_a_run_recorded_before_categories_loads_as_its_workloads_category(tiny_sweep, tmp_path):
    copy = tmp_path / "old"
    shutil.copytree(tiny_sweep / "0", copy)
    old = rundir.REQUESTS.read(copy).drop(columns="category", errors="ignore")
    rundir.REQUESTS.write(copy, old)
    loaded = load_requests(copy)
    assert set(loaded["category"]) == {"chat-lines"}
    assert not several_categories(old)
    summary = rundir.SUMMARY.read(copy)
    table = by_category(old, rundir.CYCLES.read(copy), durations_of(summary["points"]))
    assert set(table["category"]) == {"chat-lines", ALL}


def test_one_category_runs_write_no_breakdown(tiny_sweep):
    summary = json.loads((tiny_sweep / "0" / "summary.json").read_text())
    assert "by_category" not in summary and "answers_by_category" not in summary
    assert not several_categories(rundir.REQUESTS.read(tiny_sweep / "0"))


def test_alpha_by_category_pools_positions_and_shares_add_up():
    out = alpha_by_category(["qa", "code", "qa"], [3.0, 1.0, 1.0], [4, 4, 2])
    assert out["qa"]["alpha"] == pytest.approx(4 / 6) and out["code"]["alpha"] == pytest.approx(0.25)
    assert out["qa"]["prompts"] == 2 and out["qa"]["positions"] == 6
    assert sum(e["position_share"] for e in out.values()) == pytest.approx(1.0)


def test_tune_breaks_each_cell_down_per_category(harness_in_process, tmp_path):
    code = harness_in_process(tmp_path / "run", "task=tune", "+workload=en", "workload.categories=[qa,code]",
                              "workload.num_prompts=4", "workload.task_max_new_tokens=4", "task.warmup=0",
                              "task.concurrency=[1]", "gamma=[1]", "task.repeats=1")
    assert code == 0
    (cell,) = rundir.SUMMARY.read(tmp_path / "run")["cells"]
    table = pd.DataFrame(cell["by_category"])
    assert list(table[table["method"] == "fixed:gamma=1"]["category"]) == ["qa", "code", ALL]
    overall = table[table["category"] == ALL].set_index("method")
    assert (overall["requests"] == 4).all()


def test_acceptance_reports_alpha_per_category(harness_in_process, tmp_path):
    code = harness_in_process(tmp_path / "run", "task=acceptance", "+workload=en",
                              "workload.categories=[chat-lines,code]", "workload.num_prompts=4",
                              "workload.max_new_tokens=6", "workload.task_max_new_tokens=6")
    assert code == 0
    result = rundir.ACCEPTANCE.read(tmp_path / "run")
    per_category = result["alpha_by_category"]
    assert list(per_category) == ["chat-lines", "code"]
    assert sum(e["positions"] for e in per_category.values()) == sum(r["positions"] for r in result["alpha_per_prompt"])
    positions = sum(e["positions"] for e in per_category.values())
    pooled = sum(e["alpha"] * e["positions"] for e in per_category.values()) / positions
    assert pooled == pytest.approx(result["alpha"], rel=1e-6)
    assert [r["category"] for r in result["alpha_per_prompt"]] == ["chat-lines", "code"] * 2


@pytest.mark.slow(reason="a Hydra multirun of two jobs through the CLI")
def test_a_multirun_over_languages_composes_each_job_with_its_categories(cli, tmp_path):
    """With ``+workload`` swept, Hydra composes the sweep without a workload: workload keys that are not swept take
    ``++`` (``workload.categories=[qa],[code]``, swept, composes per job as it is)."""
    out = cli("-m", "+workload=it,en", "++workload.categories=[qa]", "++workload.num_prompts=2",
              "++workload.task_max_new_tokens=4", "gamma=[1]", "task.repeats=1", "task.warmup=0",
              f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    for job, lang in ((0, "it"), (1, "en")):
        requests = rundir.REQUESTS.read(tmp_path / str(job))
        assert set(zip(requests["language"], requests["category"], strict=True)) == {(lang, "qa")}


def test_draft_vocabulary_coverage_counts_the_tokens_a_reduced_draft_can_propose(feature_pair, pair):
    from workloads import answers

    _, draft = feature_pair
    ids = answers.draft_vocabulary(draft)
    assert ids == frozenset(range(48)) and answers.draft_vocabulary(pair[1]) is None
    requests = pd.DataFrame([{"prompt_id": "p0", "language": "en", "category": "qa", "output_ids": [1, 2, 50, 60]}])
    out = answers.describe_answers(requests, lambda _: "", [63], 8, {}, ids)
    assert out["draft_vocab_coverage"].tolist() == [0.5] and out["category"].tolist() == ["qa"]


def test_a_category_the_target_does_not_perform_is_named():
    from workloads import answers

    rows = [{"prompt_id": f"p{i}", "language": "it", "category": category, "finish": "length", "output_language": out,
             "expected_language": "it", "repetition": rep, "output_tokens": 8}
            for i, (category, out, rep) in enumerate([("qa", "en", 0.0), ("qa", "en", 0.1), ("code", "it", 0.6),
                                                  ("code", "it", 0.7), ("summarise", "it", 0.0)])]
    lines = answers.warnings(answers.by_category(pd.DataFrame(rows)))
    assert len(lines) == 2
    assert lines[0].startswith("qa (it): the target does not seem to do what these prompts ask (0% of answers in the")
    assert lines[1].startswith("code (it):") and "repetition 0.65" in lines[1]


def test_the_printed_table_leaves_out_the_columns_that_say_nothing(mixed_run):
    """A draft model always proposes and no request failed: no-prop % is 0 everywhere and requests are the prompts
    times the repeats, so neither is printed (the line says the repeats). Where they say something they stay."""
    from analysis.bench_table import format_category_table

    rows = rundir.SUMMARY.read(mixed_run)["by_category"]
    header, columns = format_category_table(rows).splitlines()[:2]
    assert "every prompt ran 2 times per method" in header and "no-prop" not in header
    assert "requests" not in columns and "no-prop %" not in columns and "prompts" in columns and "95% CI" in columns
    rows[1] = {**rows[1], "requests": rows[1]["requests"] - 1, "no_proposal_share": 0.25}
    header, columns = format_category_table(rows).splitlines()[:2]
    assert "requests" in columns and "no-prop %" in columns and "no-prop %: cycles that asked" in header
