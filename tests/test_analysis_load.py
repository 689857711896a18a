"""analysis.load on a real tiny sweep (made once per session by the CLI): tidy frames under recorded names,
the sweep's config as columns, the printed table as a view, and one-line errors on bad input."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.bench_table import bench_table
from analysis.load import add_speedups, load_cycles, load_points, load_requests, load_summaries, load_traces, swept
from spectune.errors import SpectuneError

METHODS = {"ar", "fixed:gamma=1", "fixed:gamma=2"}


def _jobs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())


def test_summaries_keep_recorded_names_and_carry_the_sweeps_config(tiny_sweep):
    frame = load_summaries(tiny_sweep)
    assert len(frame) == 2 * len(METHODS)  # two jobs × (AR, γ=1, γ=2)
    assert set(frame["method"]) == METHODS
    for field in ("output_throughput", "mean_tpot_ms", "p99_ttft_ms", "spec_decode_acceptance_length", "status"):
        assert field in frame, field  # vLLM's names, not the printed table's
    assert sorted(frame["cfg.concurrency"].unique()) == [1, 2]
    assert frame["concurrency"].tolist() == frame["cfg.concurrency"].tolist()
    assert swept(frame) == ["cfg.concurrency"]
    assert set(frame["job"]) == {0, 1} and frame["sweep"].nunique() == 1
    assert frame["overrides"].str.contains("concurrency=").all()
    for key in ("target", "draft", "dtype", "hardware", "execution_path", "workload"):
        assert frame[key].notna().all(), key
    assert "git_commit" in frame  # None outside a git checkout
    spec = frame[frame["method"] != "ar"]
    assert spec["spec_decode_per_position_acceptance_rates"].map(len).tolist() == spec["gamma"].tolist()


def test_a_list_of_job_dirs_loads_like_the_sweep_dir(tiny_sweep):
    whole = load_summaries(tiny_sweep)
    listed = load_summaries(_jobs(tiny_sweep))
    pd.testing.assert_frame_equal(whole, listed)


def test_the_printed_table_is_a_view_of_the_frame(tiny_sweep):
    frame = add_speedups(load_summaries(tiny_sweep))
    for run, rows in frame.groupby("run"):
        table = bench_table(rows.to_dict("records"))
        recorded = json.loads((Path(run) / "summary.json").read_text())["methods"]
        pd.testing.assert_frame_equal(table, bench_table(recorded), check_dtype=False)
        assert table["speedup"].to_numpy() == pytest.approx(rows.set_index("method")["speedup"][table.index].to_numpy())
    ar = frame[frame["method"] == "ar"]
    assert (ar["speedup"] == 1.0).all() and (ar["tpot_speedup"] == 1.0).all()


def test_requests_and_cycles_carry_the_run_context(tiny_sweep):
    requests = load_requests(tiny_sweep)
    assert len(requests) == 2 * len(METHODS) * 3  # 3 prompts per grid point
    assert {"ttft_ms", "tpot_ms", "output_ids", "cfg.concurrency", "run", "method"} <= set(requests)
    assert requests.groupby(["run", "method"]).size().eq(3).all()
    cycles = load_cycles(tiny_sweep)
    assert {"draft_s", "verify_s", "accepted", "batch_size", "cfg.concurrency"} <= set(cycles)
    assert cycles.loc[cycles["method"] == "ar", "num_drafts"].eq(0).all()
    assert cycles.loc[cycles["concurrency"] == 1, "batch_size"].eq(1).all()


@pytest.fixture
def copied(tiny_sweep, tmp_path) -> Path:
    """A private copy of the sweep that a test may damage."""
    return Path(shutil.copytree(tiny_sweep, tmp_path / "sweep"))


def test_a_directory_without_results_fails_in_one_line(tmp_path):
    empty = re.escape(f"{tmp_path} holds no spectune results: no summary.json")
    with pytest.raises(SpectuneError, match=empty) as err:
        load_summaries(tmp_path)
    assert "\n" not in str(err.value)
    with pytest.raises(SpectuneError, match="does not exist"):
        load_summaries(tmp_path / "nowhere")
    with pytest.raises(SpectuneError, match=r"no traces\.parquet"):
        load_traces(tmp_path)


def test_half_written_and_foreign_files_are_named(copied):
    job = _jobs(copied)[0]
    path = job / "requests.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(SpectuneError, match=re.escape(f"{path} is not a readable Parquet file")) as err:
        load_requests(copied)
    assert "\n" not in str(err.value)
    pd.DataFrame({"a": [1, 2]}).to_parquet(path)
    foreign = re.escape(f"{path} is not a spectune requests table: missing columns method")
    with pytest.raises(SpectuneError, match=foreign):
        load_requests(copied)
    summary = job / "summary.json"
    summary.write_text(summary.read_text()[:100])
    with pytest.raises(SpectuneError, match=re.escape(f"{summary} is not valid JSON")):
        load_summaries(copied)
    summary.write_text(json.dumps({"workload": "en"}))
    with pytest.raises(SpectuneError, match="is not a bench summary"):
        load_summaries(copied)


@pytest.mark.parametrize(("section", "key", "value", "kind"), [
    ("models", "target", "someone/else-7b", "models"),
    ("hardware", "execution_path", "compiled", "hardware"),
])
def test_mixed_runs_are_refused_unless_allowed(copied, section, key, value, kind):
    job = _jobs(copied)[1]
    meta = json.loads((job / "metadata.json").read_text())
    if section == "models":
        meta["models"]["target"]["name_or_path"] = value
    else:
        meta["hardware"][key] = value
    (job / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SpectuneError, match=re.escape(f"{job} has different {kind} from ") + ".*allow_mixed=True"):
        load_summaries(copied)
    with pytest.raises(SpectuneError, match=f"different {kind}"):
        load_cycles(copied)
    assert load_summaries(copied, allow_mixed=True)["run"].nunique() == 2


def test_per_repeat_points_load_apart_from_the_per_method_rows(tiny_sweep):
    summaries = load_summaries(tiny_sweep)
    assert not {"points", "statistics", "ranking"} & set(summaries)  # nested blocks stay out of the rows
    points = load_points(tiny_sweep)
    recorded = sum(len(json.loads((job / "summary.json").read_text())["points"]) for job in _jobs(tiny_sweep))
    assert len(points) == recorded >= len(summaries)
    assert set(points["method"]) == METHODS and {"repeat", "output_throughput", "cfg.concurrency"} <= set(points)
