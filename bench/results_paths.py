"""Rewrite the absolute paths of the machine a run ran on, in the text files of committed results, as paths a reader
can use: relative to the repository, or a named place.

    python bench/results_paths.py bench/results/NEW [...]   # rewrite in place; prints what changed per file
    python bench/results_paths.py --check bench/results     # exit 1 if any text file still holds one

A recorded run directory (``.hydra/hydra.yaml``'s output_dir, or the folder a log's last "results:" line names)
becomes its committed place under ``bench/results/``; a path inside a checkout of the repository
(``/work/main/harness/...``, ``/tmp/wt-x/spectune/...``) its path in the repository, and the checkout itself
``.``; a home folder ``~`` (the model cache: ``~/.cache/spectune``); any other folder outside the repository
``$WORK/...`` or ``$TMPDIR/...`` (a run folder that was not committed). Only path strings change: every JSON and
YAML file is parsed before and after and must hold the same numbers, and a registration (REGISTERED.md) stays as
it was registered. Binary files (Parquet, policy zips, figures) are left alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TEXT = {".json", ".yaml", ".yml", ".log", ".md", ".txt", ".csv", ".sh", ".jsonl", ".py"}
KEEP = {"REGISTERED.md"}  # registrations stay as registered
TOKEN = re.compile(r"(?<![\w.~$-])/(?:work|root|tmp|home)/[^\s\"'`,;|()\[\]{}<>]*")
TOPS = {"harness", "workloads", "spectune", "conf", "policies", "analysis", "bench", "tests", "hydra_plugins", "docs",
        "scripts", ".venv"}  # a checkout's folders: what follows its root

log = logging.getLogger("results_paths")


def recorded_runs(root: Path = RESULTS, repo: Path = REPO) -> dict[str, str]:
    """Every committed run directory's recorded absolute path (Hydra's output_dir) -> its path in the repository;
    and a folder of recorded runs -> the one folder that holds them all, where there is one."""
    out = {}
    for hydra in root.rglob(".hydra/hydra.yaml"):
        recorded = ((yaml.safe_load(hydra.read_text(encoding="utf-8")) or {}).get("hydra") or {}).get("runtime", {})
        where = recorded.get("output_dir")
        if isinstance(where, str) and where.startswith("/"):
            out[where.rstrip("/")] = hydra.parent.parent.relative_to(repo).as_posix()
    for log_file in root.rglob("__main__.log"):  # a run without .hydra/ names its folder on its last line
        said = re.findall(r"\] - results: (/\S+)", log_file.read_text(encoding="utf-8"))
        if said:
            out.setdefault(said[-1].rstrip("/"), log_file.parent.relative_to(repo).as_posix())
    parents: dict[str, set[str]] = {}  # a folder of recorded runs whose runs are all committed in one folder
    for recorded, committed in out.items():
        parents.setdefault(recorded.rsplit("/", 1)[0], set()).add(committed.rsplit("/", 1)[0])
    out.update({folder: next(iter(places)) for folder, places in parents.items()
                if len(places) == 1 and folder.count("/") > 2 and folder not in out})
    return out


def _checkout(parts: list[str]) -> int | None:
    """Where a checkout's own folders start in a path's parts (a home folder's cache is no checkout), or None."""
    if parts[1] in {"root", "home"}:
        return None
    for i in range(2, len(parts)):
        after = parts[i + 1] if i + 1 < len(parts) else ""
        if parts[i] in TOPS and (parts[i] != "bench" or after == "results" or after.endswith(".py")):
            return i  # a run folder named bench/ is no checkout's
    return None


def checkouts_of(files: list[Path]) -> set[str]:
    """The checkout roots the files' paths name (``/tmp/wt-x`` of ``/tmp/wt-x/conf``), so that a root named alone
    reads ``.``."""
    roots = set()
    for path in files:
        for match in TOKEN.finditer(path.read_text(encoding="utf-8")):
            parts = match.group(0).split("/")
            inside = _checkout(parts)
            if inside is not None:
                roots.add("/".join(parts[:inside]))
    return roots


def relative(token: str, runs: dict[str, str], checkouts: set[str]) -> str:
    """``token`` (an absolute path, perhaps with trailing punctuation) rewritten; see the module's docstring.
    ``checkouts``: the checkout roots the files name (:func:`checkouts_of`)."""
    for recorded in sorted(runs, key=len, reverse=True):
        if token == recorded or token.startswith(recorded + "/") or token.startswith(recorded + ":"):
            return runs[recorded] + token[len(recorded):]
    parts = token.split("/")
    inside = _checkout(parts)
    if inside is not None:
        return "/".join(parts[inside:])
    if parts[1] in {"root", "home"}:
        return "~/" + "/".join(parts[2 if parts[1] == "root" else 3:])
    for root in sorted(checkouts, key=len, reverse=True):
        if token == root or re.fullmatch(re.escape(root) + r"[:.]?", token):
            return "." + token[len(root):]
    if len(parts) > 3 and parts[1] == "work" and parts[2] == "runs" and (RESULTS / parts[3]).is_dir():
        return "bench/results/" + "/".join(parts[3:])
    return ("$TMPDIR/" if parts[1] == "tmp" else "$WORK/") + "/".join(parts[2:])


def _numbers(value: Any) -> Any:
    """The value with every string (keys included) replaced by a marker: its shape and numbers, what must not
    change."""
    if isinstance(value, dict):
        return [(_numbers(k), _numbers(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return "s" if isinstance(value, str) else value


def _parsed(path: Path, text: str) -> Any:
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return yaml.safe_load(text)


def rewrite(path: Path, runs: dict[str, str], checkouts: set[str]) -> int:
    """Rewrite one file in place; the number of paths changed. JSON and YAML must keep every number."""
    text = path.read_text(encoding="utf-8")
    changed = 0

    def sub(match: re.Match[str]) -> str:
        nonlocal changed
        new = relative(match.group(0), runs, checkouts)
        changed += new != match.group(0)
        return new

    new_text = TOKEN.sub(sub, text)
    if new_text == text:
        return 0
    if path.suffix in {".json", ".jsonl", ".yaml", ".yml"}:
        before, after = _parsed(path, text), _parsed(path, new_text)
        if _numbers(before) != _numbers(after):
            raise SystemExit(f"{path}: rewriting its paths would change its structure or numbers; left as it was")
    path.write_text(new_text, encoding="utf-8")
    return changed


def text_files(folders: list[Path]) -> list[Path]:
    return sorted(p for folder in folders for p in ([folder] if folder.is_file() else folder.rglob("*"))
                  if p.is_file() and p.suffix in TEXT and p.name not in KEEP)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/results_paths.py", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="results folders or files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file holds a path")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = text_files(args.folders)
    if args.check:
        left = [f"{p}: {m.group(0)}" for p in files for m in TOKEN.finditer(p.read_text(encoding="utf-8"))]
        for line in left:
            log.info("%s", line)
        return 1 if left else 0
    runs, checkouts, total = recorded_runs(), checkouts_of(files), 0
    for path in files:
        n = rewrite(path, runs, checkouts)
        if n:
            log.info("%s: %d path(s)", path, n)
        total += n
    log.info("%d path(s) rewritten in %d text file(s)", total, len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
