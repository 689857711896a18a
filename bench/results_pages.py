"""Every page generated from the committed results, written to a folder, and compared byte for byte with an earlier
copy: the check that rewriting or compacting ``bench/results/`` changed no page.

    python bench/results_pages.py OUT                   # write every page's generated text under OUT
    python bench/results_pages.py OUT --against BEFORE  # the same, then compare with BEFORE; exit 1 on a difference

The pages: each results folder's ``judge.py``, ``tables.py`` and ``spread.py`` (their printed tables and verdicts),
the files ``python -m analysis.results_index`` writes, ``python -m analysis.proposer_table``'s tables,
``python -m analysis.comparison`` over every committed ``policies.evaluate`` run (and the ``--pair`` commands the
pages show), ``python -m analysis.acceptance`` on the pairs the acceptance pages compare, and
``python -m analysis.report`` on a copy of every committed bench and tune run (its ``report.md``; the figures are
pictures of the same frames; the time it was written is masked). Run it before a change to the committed files and
again after.
"""

from __future__ import annotations

import argparse
import filecmp
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SCRIPTS = ("judge.py", "tables.py", "spread.py")
PAIRS: tuple[str, ...] = ()  # "<run> <policy> <policy>": the --pair comparisons a page shows (none now)
ACCEPTANCE_PAIRS = [(f"{folder}/smollm2-eagle-{lang}", f"{folder}/smollm2-{lang}") for lang in ("en", "it")
                    for folder in ("alpha-tasks-smollm2-cpu-20261205",)]

WRITTEN = re.compile(r"written \d{4}-\d\d-\d\dT[\d:]+(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")

log = logging.getLogger("results_pages")


def _run(args: list[str], cwd: Path = REPO) -> str:
    """A command's stdout and stderr (the analysis commands log their tables), with its exit status last; this
    checkout's packages first on the path (a results folder's script runs from its own folder)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, check=False, env=env)
    return f"{done.stdout}{done.stderr}\nexit {done.returncode}\n"


def _write(out: Path, name: str, text: str) -> None:
    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _runs_with(task_files: tuple[str, ...]) -> list[Path]:
    """Committed run directories (not in archive/) holding one of ``task_files``."""
    return sorted({p.parent for name in task_files for p in RESULTS.rglob(name)
                   if "archive" not in p.relative_to(RESULTS).parts and ".hydra" not in p.parts})


def snapshot(out: Path) -> None:
    from analysis import proposer_table, results_index
    from spectune.run import rundir

    for script in sorted(p for name in SCRIPTS for p in RESULTS.glob(f"*/{name}")):
        log.info("%s", script.relative_to(REPO))
        _write(out, f"scripts/{script.parent.name}/{script.name}.txt", _run([str(script.relative_to(REPO))]))
    for path, text in results_index.outputs(REPO).items():
        _write(out, f"results_index/{path.relative_to(REPO)}", text)
    _write(out, "proposer_table.md", proposer_table.tables())
    for run in _runs_with((rundir.COMPARISON.name,)):
        rel = run.relative_to(REPO).as_posix()
        _write(out, f"comparison/{rel}.txt", _run(["-m", "analysis.comparison", rel]))
    for pair in PAIRS:
        run, a, b = pair.split()
        _write(out, f"comparison-pair/{run}-{a}-{b}.txt",
               _run(["-m", "analysis.comparison", f"bench/results/{run}", "--pair", a, b]))
    for a, b in ACCEPTANCE_PAIRS:
        _write(out, f"acceptance/{a}.txt", _run(["-m", "analysis.acceptance", f"bench/results/{a}",
                                                 f"bench/results/{b}"]))
    for run in _runs_with((rundir.SUMMARY.name,)):
        if not rundir.REQUESTS.exists(run):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / run.name
            shutil.copytree(run, copy)
            log.info("report %s", run.relative_to(REPO))
            console = _run(["-m", "analysis.report", str(copy)]).replace(tmp, "TMP")
            report = rundir.REPORT.path(copy)
            text = report.read_text(encoding="utf-8").replace(tmp, "TMP") if report.is_file() else "(none)\n"
            text = WRITTEN.sub("written (time of writing)", text)  # when it was written: not a figure
        _write(out, f"report/{run.relative_to(REPO).as_posix()}.md", f"{text}\n---\n{console}")


def compare(out: Path, before: Path) -> list[str]:
    """Paths (relative to the folders) that differ or exist in one folder only."""
    mine = {p.relative_to(out) for p in out.rglob("*") if p.is_file()}
    theirs = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    differ = [str(p) for p in sorted(mine & theirs) if not filecmp.cmp(out / p, before / p, shallow=False)]
    return differ + [f"{p} (only in {out})" for p in sorted(mine - theirs)] + [
        f"{p} (only in {before})" for p in sorted(theirs - mine)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/results_pages.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="an empty or new folder for the pages' text")
    parser.add_argument("--against", type=Path, help="an earlier OUT: compare byte for byte, exit 1 on a difference")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.path.insert(0, str(REPO))
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty")
    snapshot(args.out)
    files = sum(1 for p in args.out.rglob("*") if p.is_file())
    if args.against is None:
        log.info("%d pages written under %s", files, args.out)
        return 0
    differ = compare(args.out, args.against)
    for line in differ:
        log.info("differs: %s", line)
    log.info("%d pages compared with %s: %s", files, args.against,
             "identical, byte for byte" if not differ else f"{len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
