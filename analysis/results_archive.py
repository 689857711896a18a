"""The archive's page: superseded explorations, one line each, whether the entry is still in the tree or has left it.

An entry leaves the tree when it is bulky and nothing current reads it: its one line stays on the page (kept in
``archive/removed.json`` with the commit that still holds it), and ``git checkout <commit> -- <path>`` restores it.
``python -m analysis.results_index`` writes the page; ``python bench/results_compact.py`` moves entries out.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from spectune.run import rundir

logger = logging.getLogger(__name__)

PAGE = "README.md"
REMOVED = "removed.json"  # {"commit": the commit that holds them, "entries": [{"name", "what", "commit"?}]}
PROBES = "probes.json"  # the scripts of bench/ that answered a question and left the tree


def removed(archive: Path) -> tuple[str, list[dict[str, str]]]:
    """The commit that still holds the entries that left the tree, and those entries (none: no file). An entry that
    left later names its own ``commit``; the others are held by the file's."""
    path = archive / REMOVED
    if not path.is_file():
        return "", []
    data = rundir.read_json(path)
    return str(data["commit"]), list(data["entries"])


def archive_page(archive: Path) -> str:
    """``archive/README.md``: one line per archived entry (a page's title, else the file's name)."""
    lines = [
        "# Archive: superseded explorations",
        "",
        "Kept for the record, not current results. Their bulky records (parquet files, policy files) left the tree",
        "on 2026-12-04 and are in git history: `git checkout 27cbd87 -- bench/results/<name>` restores one.",
        "Records marked \"left the tree\" were taken out later to keep the results within their budget; each such",
        "line names the commit that restores it. Every interval here treated each (repeat, prompt) cell as",
        "independent: too narrow (docs/statistics.md).",
        "Written by `python -m analysis.results_index`.",
        "",
    ]
    commit, gone = removed(archive)
    entries = {p.name: f"[`{p.name}`]({p.name}{'/' if p.is_dir() else ''}): {what(p)}"
               for p in archive.iterdir() if p.name not in {PAGE, REMOVED, PROBES}}
    entries.update({e["name"]: f"`{e['name']}`: {e['what']} (left the tree: `git checkout "
                                f"{e.get('commit', commit)[:7]} -- bench/results/archive/{e['name']}`)" for e in gone})
    lines += [f"- {entries[name]}" for name in sorted(entries)]
    return "\n".join(lines + probe_lines(archive)) + "\n"


def probe_lines(archive: Path) -> list[str]:
    """The probes that left bench/ (``archive/probes.json``), one line each: the script, the commit it stands at, the
    question it answered and its records here."""
    if not (archive / PROBES).is_file():
        return []
    lines = ["", "## Probes that left bench/", "",
             "One-off scripts that answered a question; each stands at its commit (`git show COMMIT:bench/SCRIPT`).",
             f"Listed from [`{PROBES}`]({PROBES}).", ""]
    for probe in json.loads((archive / PROBES).read_text(encoding="utf-8"))["probes"]:
        records = ", ".join(f"[`{r}`]({r}{'/' if (archive / r).is_dir() else ''})" if (archive / r).exists()
                            else f"`{r}` (left the tree)" for r in probe["records"])
        lines.append(f"- `bench/{probe['script']}` ({probe['commit']}): {probe['question']} Records: {records}")
    return lines


def what(entry: Path) -> str:
    """An entry's line: a page's title, a record's command or task and date, else its kind."""
    if entry.is_dir():
        pages = sorted(p for p in entry.rglob("*") if p.suffix in {".md", ".txt"})
        titles = [_title(p) for p in pages if p.suffix == ".md"]
        return ("; ".join(t for t in titles if t) or f"{len(pages)} text file(s)") + " (records in git history)"
    if entry.suffix == ".md":
        return _title(entry) or "notes"
    if entry.suffix == ".json":
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except ValueError:
            return "JSON (unreadable)"
        if not isinstance(data, dict):
            return "JSON record"
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        date = str(meta.get("created_utc") or data.get("created_utc") or "")[:10]
        if isinstance(data.get("command"), str):
            what = f"JSON record of `{data['command'].strip()}`"
        elif isinstance(data.get("task"), str):
            what = f"JSON record of task `{data['task']}`"
        else:
            what = "JSON record"
        return what + (f", {date}" if date else "")
    return {".csv": "table (CSV)", ".png": "figure", ".txt": "console output", ".jsonl": "JSON lines"}.get(
        entry.suffix, "file")


def _title(page: Path) -> str:
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


