"""The committed results index is what `python -m analysis.results_index` writes from the run directories, every
`bench/results/` path the README and the docs cite exists, and the results folder stays small."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis import results_index
from spectune.errors import SpectuneError
from tests.conftest import REPO

RESULTS = REPO / "bench" / "results"
LIMIT_BYTES = 32 * 1024 * 1024  # run directories as the product wrote them (timed runs of 256-token answers with
# every token's time and id: ~1-2 MiB each; an evaluate run with its traces and PPO file ~1.5 MiB); explorations go to
# archive/ or history


def test_committed_tables_equal_what_the_command_writes():
    wanted = results_index.outputs(REPO)
    stale = [str(p.relative_to(REPO)) for p, text in wanted.items() if p.read_text(encoding="utf-8") != text]
    assert not stale, f"out of step with the run directories: {stale}; run python -m analysis.results_index"


def test_every_run_directory_has_a_row_and_every_row_a_directory():
    runs = results_index.find_runs(RESULTS)
    assert runs, "no run directory under bench/results"
    page = (RESULTS / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| \d{4}-\d\d-\d\d .*\[([^\]]+)\]\(\1/\) \|$", page, re.M)
    assert sorted(rows) == sorted(p.relative_to(RESULTS).as_posix() for p in runs)


def test_the_headline_is_read_from_the_run_not_typed(tmp_path):
    """Change a run's recorded α and the row changes with it."""
    src = next(p for p in results_index.find_runs(RESULTS) if (p / "acceptance.json").is_file())
    run = tmp_path / "results" / "one"
    shutil.copytree(src, run)
    (run / ".hydra" / "overrides.yaml").unlink(missing_ok=True)  # the case under test: a command rebuilt (†)
    data = json.loads((run / "acceptance.json").read_text(encoding="utf-8"))
    data["alpha"] = 0.123456
    data["alpha_ci95_over_prompts"].update(lo=0.1, hi=0.2)
    (run / "acceptance.json").write_text(json.dumps(data), encoding="utf-8")
    row = results_index.describe(run, tmp_path / "results")
    assert row.short == "α 0.123 [0.100, 0.200]"
    assert row.command.endswith("†"), "a run without an overrides file says its command was rebuilt"


def test_a_run_the_index_cannot_read_is_one_line(tmp_path):
    run = tmp_path / "results" / "broken"
    run.mkdir(parents=True)
    (run / "metadata.json").write_text(json.dumps({"task": "bench", "format_version": 2}), encoding="utf-8")
    with pytest.raises(SpectuneError) as err:
        results_index.describe(run, tmp_path / "results")
    assert "\n" not in str(err.value) and "summary.json" in str(err.value)


def test_check_mode_reports_a_stale_table(tmp_path, capsys):
    repo = tmp_path / "repo"
    shutil.copytree(RESULTS / "tiny-acceptance-cpu-20261204", repo / "bench/results/tiny-acceptance-cpu-20261204")
    (repo / "docs").mkdir()
    for page in ("README.md", "docs/results.md"):
        (repo / page).write_text(f"x\n{results_index.BEGIN}\nold\n{results_index.END}\n", encoding="utf-8")
    assert results_index.main(["--check", "--repo", str(repo)]) == 1
    assert "out of step: README.md" in capsys.readouterr().out
    assert results_index.main(["--repo", str(repo)]) == 0
    assert results_index.main(["--check", "--repo", str(repo)]) == 0


def test_cited_results_exist():
    """Every bench/results/... path (and `archive/...`) named in README.md and docs/ is in the tree."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        refs = re.findall(r"bench/results/[\w./{},<>|*…-]+", text)
        refs += ["bench/results/" + ref for ref in re.findall(r"`(archive/[\w./-]+)`", text)]
        for ref in refs:
            path = re.split(r"[<{*…]", ref)[0].rstrip("/.,")
            if not (REPO / path).exists() and not list((REPO / path).parent.glob(Path(path).name + "*")):
                missing.append(f"{page.relative_to(REPO)}: {ref}")
    assert not missing, missing


def test_results_stay_small():
    size = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert size <= LIMIT_BYTES, f"bench/results holds {size / 2**20:.1f} MiB (limit {LIMIT_BYTES / 2**20:.0f})"


def test_every_probe_that_left_bench_is_indexed_with_its_commit_and_records():
    """archive/probes.json names each probe once, with the commit it stands at, its question and its records (which
    exist here); none is in bench/ any more, each has its line on the archive page, and where git has the commit the
    script is there."""
    archive = RESULTS / "archive"
    probes = json.loads((archive / results_index.PROBES).read_text(encoding="utf-8"))["probes"]
    page = (archive / "README.md").read_text(encoding="utf-8")
    scripts = [probe["script"] for probe in probes]
    assert scripts and len(scripts) == len(set(scripts))
    for probe in probes:
        assert not (REPO / "bench" / probe["script"]).exists(), probe["script"]
        assert re.fullmatch(r"[0-9a-f]{7,40}", probe["commit"]) and probe["question"].endswith("?")
        assert probe["records"] and all((archive / record).exists() for record in probe["records"]), probe
        assert f"- `bench/{probe['script']}` ({probe['commit']}): {probe['question']}" in page
        known = subprocess.run(["git", "cat-file", "-e", probe["commit"]], cwd=REPO, capture_output=True)
        if known.returncode == 0:  # a full clone: the script stands at the commit named
            at = subprocess.run(["git", "cat-file", "-e", f"{probe['commit']}:bench/{probe['script']}"], cwd=REPO)
            assert at.returncode == 0, probe
