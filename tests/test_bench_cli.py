"""`python -m harness` bench end to end on the embedded tiny pair: files, fields, sweeps, bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from spectune.errors import SpectuneError
from tests.conftest import SMALL_BENCH as SMALL


@pytest.mark.slow(reason="a real bench run through the CLI")
def test_bench_writes_records_summary_and_metadata(cli, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli(*SMALL, "gamma=[1,3]", "concurrency=2", "task.repeats=2", "task.noise_floor=true",
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fixed:gamma=3" in proc.stdout and "speedup" in proc.stdout and "95% CI" in proc.stdout
    assert "by throughput:" in proc.stdout and "MAD rule" in proc.stdout and "noise floor (A/A" in proc.stdout
    # every table says its unit, where its variance comes from and what it can resolve
    assert "unit = block of 2 consecutive prompts" in proc.stdout and "between repeats" in proc.stdout
    assert "MDE" in proc.stdout

    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert set(requests["method"]) == {"ar", "ar#2", "fixed:gamma=1", "fixed:gamma=3"}
    assert set(requests["repeat"]) == {0, 1} and len(requests) == 4 * 2 * 3  # methods x repeats x prompts
    assert (requests["output_tokens"] >= 1).all() and (requests["output_tokens"] <= 8).all()
    assert {"ttft_ms", "tpot_ms", "e2el_ms", "itls_ms", "output_ids", "token_times_s"} <= set(requests.columns)
    cycles = pd.read_parquet(run_dir / "cycles.parquet")
    spec = cycles[cycles["method"] == "fixed:gamma=3"]
    assert (spec["num_drafts"] == 3).all() and spec["accepted"].between(0, 3).all()
    assert (spec["emitted"] <= spec["accepted"] + 1).all()

    summary = json.loads((run_dir / "summary.json").read_text())
    methods = {m["method"]: m for m in summary["methods"]}
    g3 = methods["fixed:gamma=3"]
    assert g3["status"] == "ok" and g3["completed"] == 6 and g3["failed"] == 0 and g3["repeats"] == 2
    for key in ("output_throughput", "request_throughput", "p99_ttft_ms", "median_tpot_ms", "p90_itl_ms",
                "spec_decode_acceptance_length", "spec_decode_per_position_acceptance_rates", "peak_rss_bytes"):
        assert g3[key] is not None, key
    assert len(g3["spec_decode_per_position_acceptance_rates"]) == 3
    # repeats: CIs over units (here blocks of 2 prompts, one batch); p99 CIs only with >= 100 samples behind them
    for key in ("output_throughput", "speedup", "p50_ttft_ms", "p50_tpot_ms", "p50_e2el_ms"):
        assert g3[f"{key}_ci95_lo"] <= g3[f"{key}_ci95_hi"], key
    assert g3["p99_ttft_ms_ci95_lo"] is None and g3["ttft_samples"] == 6
    assert len(g3["output_throughput_per_repeat"]) == 2
    assert g3["output_throughput"] == pytest.approx(sorted(g3["output_throughput_per_repeat"])[0] / 2
                                                    + sorted(g3["output_throughput_per_repeat"])[1] / 2)
    st = summary["statistics"]
    assert st["n_units"] == 2 and st["unit_size"] == 2 and st["repeats"] == 2 and "jackknife" in st["interval"]
    assert g3["speedup_verdict"] and "speedup_between_units_sd_pct" in g3
    assert summary["noise_floor_pct"] is not None and summary["repeats"] == 2
    assert sum(m["best"] for m in summary["methods"]) == 1 and not methods["ar#2"]["best"]
    order = [(p["method"], p["repeat"]) for p in summary["points"]]
    assert order == [("ar", 0), ("ar#2", 0), ("fixed:gamma=1", 0), ("fixed:gamma=3", 0),
                     ("ar#2", 1), ("fixed:gamma=1", 1), ("fixed:gamma=3", 1), ("ar", 1)]  # rotated per repeat
    assert sum(g3["accepted_length_histogram"]) == g3["spec_decode_num_drafts"]
    assert g3["spec_decode_acceptance_length"] == pytest.approx(
        1 + g3["spec_decode_accepted_tokens"] / g3["spec_decode_num_drafts"])

    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["hardware"]["execution_path"] == "eager"
    assert meta["models"]["target"]["parameters"] > meta["models"]["draft"]["parameters"]
    assert meta["git"]["commit"] and meta["packages"]["torch"]
    assert meta["workload"]["language"] == "en"


@pytest.mark.slow(reason="a real open-loop bench run through the CLI")
def test_open_loop_poisson_arrivals(cli, tmp_path):
    proc = cli(*SMALL, "gamma=2", "request_rate=50", "concurrency=2", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    arrivals = requests[requests["method"] == "ar"]["arrival_s"].sort_values().to_numpy()
    assert arrivals[0] == 0 and (arrivals[1:] > 0).all()
    assert (requests["admitted_s"] >= requests["arrival_s"]).all()


@pytest.mark.slow(reason="a whole sweep through the CLI (basic and submitit launchers)")
@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
def test_multirun_sweep_over_workloads_and_gamma(cli, tmp_path, launcher):
    # In a sweep the workload group is chosen per job, so its fields take `++` (add or override).
    proc = cli("-m", "+workload=en,zh", "++workload.categories=[chat-lines]", "++workload.num_prompts=2",
               "++workload.max_new_tokens=6", "task.warmup=0", "task.baseline=false", "task.repeats=1", "gamma=1,2",
               f"hydra/launcher={launcher}", f"hydra.sweep.dir={tmp_path}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = sorted(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 4
    seen = {(json.loads(p.read_text())["workload"], json.loads(p.read_text())["methods"][0]["method"])
            for p in summaries}
    assert seen == {(w, f"fixed:gamma={g}") for w in ("en", "zh") for g in (1, 2)}


BAD_INPUT = [
    ("gamma=0", "gamma=0"),
    ("gamma=[1,-2]", "gamma=-2"),
    ("concurrency=0", "concurrency=0"),
    ("request_rate=0", "request_rate=0"),
    ("workload.max_new_tokens=0", "max_new_tokens"),
    ("policy=greedy-guess", "policy='greedy-guess'"),
    ("hardware=cuda", "CUDA"),
    ("task.repeats=0", "task.repeats=0"),
    ("gamma=[]", "gamma=[]"),
    ("slo.ttft_ms=0", "slo.ttft_ms=0"),
    ("slo.e2el_ms=-1", "slo.e2el_ms=-1"),
    ("task.block_prompts=0", "task.block_prompts=0"),
]


@pytest.mark.parametrize(("override", "names"), BAD_INPUT)
def test_bad_input_is_one_line_naming_the_value_and_writes_nothing(harness_in_process, tmp_path, override, names):
    with pytest.raises(SpectuneError) as err:
        harness_in_process(tmp_path / "run", *SMALL, override)
    assert names in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())


# In process: the front door's checks, Hydra's composition and the task (conftest.harness_in_process).
# One of each kind of check, through the real command line: a setting (inside the job, before the models load)
# and a group option (before Hydra composes).
@pytest.mark.parametrize(("override", "names"), [BAD_INPUT[0], BAD_INPUT[5]])
def test_bad_input_is_one_line_exit_2(cli, tmp_path, override, names):
    proc = cli(*SMALL, override, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and names in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_missing_workload_and_long_prompt_errors(harness_in_process, tmp_path):
    with pytest.raises(SpectuneError, match=r"\+workload="):
        harness_in_process(tmp_path)
    with pytest.raises(SpectuneError, match="context") as err:  # after the models load: their context length
        harness_in_process(tmp_path, *SMALL, "workload.max_new_tokens=100000")
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


@pytest.mark.slow(reason="a real bench run through the CLI")
def test_a_failing_grid_point_is_recorded_and_the_sweep_goes_on(cli, tmp_path):
    """A static cache sized for short blocks: γ = 1 fits, γ = 40 cannot — that point fails, the rest run."""
    proc = cli(*SMALL, "gamma=[1,40]", "hardware=cpu-static", "hardware.max_cache_len=72",
                   "workload.prompt_tokens=[24,48]", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    methods = {m["method"]: m for m in json.loads((tmp_path / "summary.json").read_text())["methods"]}
    assert methods["ar"]["status"] == "ok" and methods["fixed:gamma=1"]["status"] == "ok"
    assert methods["fixed:gamma=40"]["status"] == "failed" and "γ=40" in methods["fixed:gamma=40"]["error"]
    assert set(pd.read_parquet(tmp_path / "requests.parquet")["method"]) == {"ar", "fixed:gamma=1"}
    assert "grid point fixed:gamma=40 failed" in proc.stderr


@pytest.mark.slow(reason="a whole sweep through the CLI")
def test_sweep_with_a_bad_job_runs_the_others_and_exits_2(cli, tmp_path):
    proc = cli("-m", "+workload=en", "gamma=0,1", "++workload.categories=[chat-lines]", "++workload.num_prompts=2",
               "++workload.max_new_tokens=4", "task.warmup=0", "task.baseline=false", "task.repeats=1",
               f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert json.loads((tmp_path / "0" / "error.json").read_text())["error"].startswith("gamma=0 is invalid")
    assert (tmp_path / "1" / "summary.json").exists()
    assert "1 job(s) of the sweep failed" in proc.stderr


def test_interleaved_blocks_do_the_whole_runs_work(harness_in_process, tmp_path):
    """task.block_prompts=1 on 3 prompts, 2 repeats, with the A/A row: every (method, repeat) is one point over all
    3 prompts, merged from 3 blocks, and each request's tokens are those of the run without blocks (keyed
    randomness: when a prompt runs changes nothing it emits)."""
    import json

    import pandas as pd

    settings = [*SMALL, "task.repeats=2", "task.noise_floor=true", "gamma=[2]"]
    assert harness_in_process(tmp_path / "whole", *settings) == 0
    assert harness_in_process(tmp_path / "blocks", *settings, "task.block_prompts=1") == 0
    summary = json.loads((tmp_path / "blocks" / "summary.json").read_text())
    assert len(summary["points"]) == 6 and {p["blocks"] for p in summary["points"]} == {3}
    assert {p["completed"] for p in summary["points"]} == {3}
    assert summary["noise_floor_pct"] is not None
    tokens = {}
    for name in ("whole", "blocks"):
        req = pd.read_parquet(tmp_path / name / "requests.parquet")
        tokens[name] = {(m, r, p): list(ids) for m, r, p, ids in zip(req["method"], req["repeat"], req["prompt_id"],
                                                                   req["output_ids"], strict=True)}
    assert tokens["blocks"] == tokens["whole"] and len(tokens["whole"]) == 18


@pytest.mark.parametrize(("override", "names"), [
    (["concurrency=2", "task.block_prompts=3"], "task.block_prompts=3 is invalid"),
    (["request_rate=2.0", "task.block_prompts=1"], "blocks need a closed loop"),
])
def test_blocks_that_cannot_interleave_are_refused(harness_in_process, tmp_path, override, names):
    with pytest.raises(SpectuneError, match=names):
        harness_in_process(tmp_path / "run", *SMALL, *override)
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())
