"""The committed results index is what `python -m analysis.results_index` writes from the run directories, every
`bench/results/` path the README and the docs cite exists, no page or command shows an absolute path of the machine
a run ran on, the front page stays short and the results folder within its budget."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis import results_archive, results_index
from spectune.errors import SpectuneError
from tests.conftest import REPO

RESULTS = REPO / "bench" / "results"
LIMIT_BYTES = 16 * 1024 * 1024  # the tracked results' budget: fixed, not raised to fit a new result
README_LIMIT_BYTES = 16 * 1024
ABSOLUTE = re.compile(r"(?<![\w.~$-])/(?:work|root|tmp|home|Users|mnt|scratch|private|var/folders)/")


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
    markers = (f"{results_index.BEGIN}\nold\n{results_index.END}\n"
               f"{results_index.HEADLINE_BEGIN}\nold\n{results_index.HEADLINE_END}\n")
    for page in ("README.md", "docs/results.md"):
        (repo / page).write_text(f"x\n{markers}", encoding="utf-8")
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


def _tracked(folder: Path) -> list[Path]:
    """The files git tracks under ``folder`` (all files where the checkout is not a git work tree)."""
    done = subprocess.run(["git", "ls-files", "-z", str(folder.relative_to(REPO))], cwd=REPO, capture_output=True,
                          check=False)
    if done.returncode != 0:
        return [p for p in folder.rglob("*") if p.is_file()]
    return [REPO / name for name in done.stdout.decode().split("\0") if name and (REPO / name).is_file()]


def test_results_stay_within_their_budget():
    size = sum(p.stat().st_size for p in _tracked(RESULTS))
    assert size <= LIMIT_BYTES, (
        f"bench/results holds {size / 2**20:.1f} MiB of tracked files, over its {LIMIT_BYTES / 2**20:.0f} MiB budget. "
        "The limit is not raised to fit new results: compact them (python bench/results_compact.py RUN_DIR) or archive "
        "what they supersede (docs/results.md, Adding a result)")


def test_the_front_page_stays_short():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes (limit {README_LIMIT_BYTES}): point to docs/ instead"


def _shown_text() -> dict[str, str]:
    """Every page the index writes, every results page (less REGISTERED.md: a registration stays as registered),
    and the commands the pages show (run scripts, recorded overrides)."""
    texts = {str(p.relative_to(REPO)): text for p, text in results_index.outputs(REPO).items()}
    for path in _tracked(RESULTS):
        if path.name in {"README.md", "overrides.yaml"} or path.suffix == ".sh" or (
                path.suffix == ".md" and path.name != "REGISTERED.md"):
            texts[str(path.relative_to(REPO))] = path.read_text(encoding="utf-8")
    return texts


def test_no_page_or_command_shows_an_absolute_path_of_the_machine():
    found = [f"{name}: {text[match.start():match.start() + 60].split()[0]}" for name, text in _shown_text().items()
             for match in ABSOLUTE.finditer(text)]
    assert not found, f"absolute paths (python bench/results_paths.py rewrites them): {found[:5]}"


def test_the_absolute_path_check_catches_one():
    assert ABSOLUTE.search("task.profile=/work/runs/x/profile.json") and ABSOLUTE.search("`/root/.cache/spectune`")
    assert not ABSOLUTE.search("bench/results/x/tmp/y ~/.cache/spectune $TMPDIR/x https://host/work/a")


def test_where_ar_is_fastest_the_headline_states_the_speculative_speedup():
    """A bench run that AR won still shows what speculation did: the fastest speculative method's speed-up, read
    from the run (here prompt lookup at T = 1)."""
    run = RESULTS / "lookup-timed-smollm2-cpu-20261205" / "t1-en"
    method = next(m for m in json.loads((run / "summary.json").read_text(encoding="utf-8"))["methods"]
                  if m["method"] == "fixed:gamma=8")
    row = results_index.describe(run, RESULTS)
    assert row.short == (f"no speculative method beats AR: best fixed:gamma=8 {method['speedup']:.2f}× "
                         f"[{method['speedup_ci95_lo']:.2f}, {method['speedup_ci95_hi']:.2f}] AR")
    assert method["speedup_ci95_hi"] < 1


def test_a_registered_reading_is_labelled_and_a_later_one_is_exploratory(tmp_path):
    """coverage.at-registration.json is the registered reading, coverage.json beside it a later one; a run under a
    REGISTERED.md without such a copy is registered as it stands; without REGISTERED.md neither label shows."""
    later = results_index.describe(RESULTS / "coverage-tiny-cpu-20261204" / "c1-greedy", RESULTS).short
    assert later.startswith("registered: no difference (ar, fixed): 46/50 contain 0")
    assert "exploratory (an interval developed after these data were seen): no difference (ar, fixed): 48/50" in later
    as_registered = results_index.describe(RESULTS / "coverage-tiny-r3-cpu-20261204" / "c4-t1", RESULTS).short
    assert as_registered.startswith("registered: no difference (ar, fixed): 18/20")
    assert "exploratory" not in as_registered
    shutil.copytree(RESULTS / "coverage-tiny-r3-cpu-20261204" / "c4-t1", tmp_path / "results" / "c4-t1")
    bare = results_index.describe(tmp_path / "results" / "c4-t1", tmp_path / "results").short
    assert bare.startswith("no difference (ar, fixed): 18/20")


def test_the_front_page_answers_follow_the_runs(tmp_path):
    """Copy the runs of the first question, make one of them slower than AR, and the row and the conclusion's
    sentence change with it: nothing in them is typed in."""
    from analysis import headlines

    root = tmp_path / "results"
    question = headlines.QUESTIONS[0]
    for pattern in question.runs:
        for run in RESULTS.glob(pattern):
            shutil.copytree(run, root / run.relative_to(RESULTS))
    before = headlines.answers(root)
    assert len(before) == 1 and before[0].text.startswith("faster than AR in all 4 runs")
    summary_path = root / "lookup-timed-smollm2-cpu-20261205" / "greedy-en" / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    for row in summary["by_task"]:  # the committed file as written, before categories were named so
        if row["method"] == "fixed:gamma=8" and row["task"] == "all":
            row.update(decode_speedup=0.5, decode_speedup_ci95_lo=0.4, decode_speedup_ci95_hi=0.6)
    summary_path.write_text(json.dumps(summary), encoding="utf-8")
    after = headlines.answers(root)[0]
    assert after.text.startswith("faster than AR in 3, slower in 1, not resolved in 0 of 4 runs")
    assert "en 0.50× [0.40, 0.60]" in after.text and "(0.50–2.58×" in after.sentence
    assert headlines.conclusion(root).endswith(after.sentence)


@pytest.mark.parametrize("marker", ["-", "+", "*", "1.", "12)", "#", "##", ">5%", "===", "---"])
def test_a_conclusion_is_wrapped_at_spaces_and_no_line_starts_a_markdown_block(marker):
    """A word that would open a list, heading, quote or rule at a line's start takes the word before it along."""
    text = f"aaa {'x' * 116} {marker} y"  # the marker would start the second line
    lines = results_index.wrapped(text, 120).splitlines()
    assert lines[0] == "aaa" and lines[1].startswith(f"{'x' * 116} {marker}") and " ".join(lines) == text
    plain = " ".join(f"w{i}" for i in range(200))
    lines = results_index.wrapped(plain, 40).splitlines()
    assert " ".join(lines) == plain and all(len(line) <= 40 for line in lines) and len(lines) > 10
    assert results_index.wrapped("y" * 50 + " z", 40).splitlines() == ["y" * 50, "z"]  # a long word stands alone


def test_the_readme_prose_is_in_lines_of_at_most_120_characters():
    """Outside code blocks (a program's output, as it prints) and tables (a row is one line in Markdown), every
    line of README.md reads without scrolling."""
    long, code = [], False
    for number, line in enumerate((REPO / "README.md").read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            code = not code
        elif not code and not line.startswith("|") and len(line) > results_index.PROSE_WIDTH:
            long.append(f"README.md:{number}: {len(line)} characters")
    assert not long, "\n".join(long)


def test_every_probe_that_left_bench_is_indexed_with_its_commit_and_records():
    """archive/probes.json names each probe once, with the commit it stands at, its question and its records (here,
    or listed as having left the tree); none is in bench/ any more, each has its line on the archive page, and where
    git has the commit the script is there."""
    archive = RESULTS / "archive"
    probes = json.loads((archive / results_archive.PROBES).read_text(encoding="utf-8"))["probes"]
    page = (archive / "README.md").read_text(encoding="utf-8")
    scripts = [probe["script"] for probe in probes]
    assert scripts and len(scripts) == len(set(scripts))
    for probe in probes:
        assert not (REPO / "bench" / probe["script"]).exists(), probe["script"]
        assert re.fullmatch(r"[0-9a-f]{7,40}", probe["commit"]) and probe["question"].endswith("?")
        gone = {entry["name"] for entry in results_archive.removed(archive)[1]}  # records that left the tree
        assert probe["records"] and all((archive / r).exists() or r in gone for r in probe["records"]), probe
        assert f"- `bench/{probe['script']}` ({probe['commit']}): {probe['question']}" in page
        known = subprocess.run(["git", "cat-file", "-e", probe["commit"]], cwd=REPO, capture_output=True)
        if known.returncode == 0:  # a full clone: the script stands at the commit named
            at = subprocess.run(["git", "cat-file", "-e", f"{probe['commit']}:bench/{probe['script']}"], cwd=REPO)
            assert at.returncode == 0, probe


def test_every_bench_script_the_code_and_docs_name_is_in_bench():
    """A ``bench/<script>.py`` in the library, the applications, the tests, conf/ or the docs is a script a reader can
    open; a probe that left is cited as archived (its name, bench/results/archive/probes.json), not by a path that
    is gone. The committed results (bench/results/) are records of their day and are not read."""
    roots = ("spectune", "workloads", "policies", "analysis", "harness", "hydra_plugins", "bench", "tests", "conf",
             "docs", "scripts")
    files = [REPO / "README.md", *(p for root in roots for p in sorted((REPO / root).rglob("*"))
                                   if p.suffix in {".py", ".md", ".yaml", ".ipynb", ".toml"})]
    stale = [f"{path.relative_to(REPO)}: bench/{name}" for path in files
             if path.relative_to(REPO).parts[:2] != ("bench", "results")
             for name in re.findall(r"\bbench/([A-Za-z0-9_]+\.py)\b", path.read_text(encoding="utf-8"))
             if not (REPO / "bench" / name).exists()]
    assert not stale, "cite a removed script as an archived probe (bench/results/archive/probes.json):\n" + \
        "\n".join(stale)
