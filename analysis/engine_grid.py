"""The tables of a grid of bench runs across engines, languages, sampling and load, with a recommendation per cell.

    python -m analysis.engine_grid RESULTS [--reference REF ...]          # write RESULTS/TABLES.md, print it
    python -m analysis.engine_grid RESULTS [--reference REF ...] --check  # exit 1 if TABLES.md is not what they give

Every bench run directory below ``RESULTS`` is one cell, keyed by what its own metadata recorded: the engine (and
the served weights), the language, the temperature and the concurrency. Each method's numbers are recomputed from
the run's request rows by :func:`spectune.stats.by_category.by_category` (as the run's summary computes them):
the speed-up over AR in output tokens per wall second with its paired 95% interval (prompts as the unit), the decode
speed-up (wall minus TTFT), per category; acceptance is accepted over drafted tokens (a server's own counters, or
spectune's cycle rows).

The rule that turns a cell into a recommendation: a method **pays** where its speed-up's 95% lower bound is above 1,
**loses** where the upper bound is below 1, else it is **not resolved**; the recommendation is the paying method
with the highest estimate, and with none paying, no speculation (AR).

``--reference`` adds cells from other runs (spectune's own engine, measured on another day) restricted to the prompts
the grid's cell of the same language and temperature measured, each (method, repeat) run's duration scaled to
those prompts' share of it, so both engines are read on the same prompts; such rows say where they come from.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from spectune.engine.records import per_request_acceptance
from spectune.methods import BASELINE, Method
from spectune.run import rundir
from spectune.stats.by_category import ALL, by_category, durations_of

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
TABLES = "TABLES.md"
PAYS, LOSES, UNRESOLVED = "pays", "loses", "not resolved"


@dataclass
class Cell:
    """One bench run: what it measured on, and its methods' rows (per category and ``all``)."""

    name: str
    engine: str
    language: str
    temperature: float
    concurrency: int
    prompts: list[str]
    rows: pd.DataFrame
    ar_tok_s: float | None
    source: str = ""  # where a reference cell's numbers come from (empty: this grid's own run)
    drafter: str = ""  # what drafts on spectune's engine (its proposer), named in its methods
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, float, int]:
        return self.engine, self.language, self.temperature, self.concurrency


def is_bench_run(path: Path) -> bool:
    return rundir.SUMMARY.exists(path) and rundir.REQUESTS.exists(path) and rundir.METADATA.exists(path)


def runs_below(root: Path) -> list[Path]:
    """Every bench run directory at or below ``root``, sorted by path."""
    found = [p.parent for p in root.rglob(rundir.SUMMARY.name)]
    return sorted(p for p in found if is_bench_run(p) and "pilot" not in p.parts and "confirm" not in p.parts)


def engine_label(meta: dict[str, Any]) -> str:
    """``llama.cpp Q4_1`` / ``llama.cpp F32`` / ``spectune float32``: the engine and what it computes with."""
    engine = meta.get("engine") or {}
    name = engine.get("engine", "spectune")
    if name == "llamacpp":
        weights = "F32" if engine.get("weights") == "f32" else Path(str(engine.get("shipped_model", ""))).stem.split(
            ".")[-1] or "shipped"
        return f"llama.cpp {weights}"
    return f"{name} {(meta.get('hardware') or {}).get('dtype', '')}".strip()


def method_label(method: str, drafter: str) -> str:
    """``ngram-mod γ 8``, ``lookup γ 8`` (spectune's fixed γ named by its proposer), ``AR``."""
    if method == BASELINE:
        return "AR"
    parsed = Method.parse(method)
    name = drafter if parsed.is_fixed and drafter else parsed.name
    return f"{name} γ {parsed.gamma}"


def read_cell(path: Path, *, only: list[str] | None = None, source: str = "") -> Cell:
    """The cell a run directory measured; ``only``: its requests restricted to these prompt ids (durations scaled)."""
    meta, summary = rundir.METADATA.read(path), rundir.SUMMARY.read(path)
    requests = rundir.REQUESTS.read(path)
    cycles = rundir.CYCLES.read(path) if _has_rows(rundir.CYCLES, path) else None  # a server's is empty
    durations = durations_of(summary.get("points") or [])
    if only is not None:
        durations = _scaled(requests, durations, set(only))
        requests = requests[requests["prompt_id"].isin(only)]
        cycles = cycles[cycles["request_id"].isin(set(requests["request_id"]))] if cycles is not None else None
    rows = by_category(requests, cycles, durations, unit_size=1)
    requests = _with_drafts(requests, cycles)
    rows["acceptance"] = [_acceptance(requests, m, c) for m, c in zip(rows["method"], rows["category"], strict=True)]
    ar = rows[(rows["method"] == BASELINE) & (rows["category"] == ALL)]
    config = meta.get("config") or {}
    drafter = str((config.get("proposer") or {}).get("name") or "") if engine_label(meta).startswith("spectune") else ""
    return Cell(path.name, engine_label(meta), str((meta.get("workload") or {}).get("language") or "?"),
                float((meta.get("sampling") or {}).get("temperature", 0.0)), int(config.get("concurrency") or 1),
                list(dict.fromkeys(requests["prompt_id"])), rows,
                float(ar["output_throughput"].iloc[0]) if len(ar) else None, source, drafter)


def _has_rows(file: Any, path: Path) -> bool:
    return file.exists(path) and pq.ParquetFile(file.found(path)).metadata.num_rows > 0


def _scaled(requests: pd.DataFrame, durations: dict[tuple[str, int], float],
            keep: set[str]) -> dict[tuple[str, int], float]:
    """Each (method, repeat) run's seconds times the kept prompts' share of its E2E time: a request keeps the time
    share it had in the whole run (as :func:`spectune.stats.compare.throughput_terms` gives it)."""
    out = {}
    for (method, repeat), seconds in durations.items():
        mine = requests[(requests["method"] == method) & (requests["repeat"] == repeat) & (requests["status"] == "ok")]
        total = float(mine["e2el_ms"].sum())
        out[(method, repeat)] = seconds * float(mine[mine["prompt_id"].isin(keep)]["e2el_ms"].sum()) / total if total \
            else seconds
    return out


def _with_drafts(requests: pd.DataFrame, cycles: pd.DataFrame | None) -> pd.DataFrame:
    """Each request's drafted and accepted tokens: as recorded (a server's counters; spectune's engine records them
    too), or for an older run that did not, from its cycle rows (:func:`per_request_acceptance`)."""
    if "drafted_tokens" in requests or cycles is None:
        return requests
    keys = ["method", "repeat", "request_id"]
    counts = per_request_acceptance(cycles, tuple(keys))[[*keys, "drafted_tokens", "accepted_tokens"]]
    return requests.merge(counts, on=keys, how="left")


def _acceptance(requests: pd.DataFrame, method: str, category: str) -> float | None:
    """Accepted over drafted tokens of ``method``'s requests (in ``category``, or all)."""
    mine = requests[requests["method"] == method]
    if category != ALL:
        mine = mine[mine["category"] == category]
    drafted = float(mine["drafted_tokens"].sum())
    return float(mine["accepted_tokens"].sum()) / drafted if drafted else None


def judged(lo: float | None, hi: float | None) -> str:
    """The registered rule: pays (lower bound above 1), loses (upper bound below 1), else not resolved."""
    if lo is None or hi is None:
        return UNRESOLVED
    return PAYS if lo > 1 else LOSES if hi < 1 else UNRESOLVED


def recommendation(cell: Cell) -> str:
    """The sentence of a cell under the registered rule."""
    overall = cell.rows[(cell.rows["category"] == ALL) & (cell.rows["method"] != BASELINE)]
    paying = [r for r in overall.to_dict("records") if judged(r["speedup_ci95_lo"], r["speedup_ci95_hi"]) == PAYS]
    if paying:
        best = max(paying, key=lambda r: r["speedup"])
        return f"{method_label(best['method'], cell.drafter)}: {_speedup(best)}"
    if not len(overall):
        return "no speculative method measured"
    top = overall.loc[overall["speedup"].idxmax()]
    verdicts = [judged(r["speedup_ci95_lo"], r["speedup_ci95_hi"]) for r in overall.to_dict("records")]
    said = "every method loses" if all(v == LOSES for v in verdicts) else "none pays"
    return f"no speculation ({said}; highest {method_label(top['method'], cell.drafter)} {_speedup(top)})"


def _speedup(row: Any, key: str = "speedup") -> str:
    value, lo, hi = row.get(key), row.get(f"{key}_ci95_lo"), row.get(f"{key}_ci95_hi")
    if value is None or pd.isna(value):
        return "-"
    return f"{value:.2f}× [{lo:.2f}, {hi:.2f}]" if lo is not None and not pd.isna(lo) else f"{value:.2f}×"


def _pct(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"{100 * value:.0f}%"


def _t(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"T = {temperature:g}"


def markdown(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(
        index=False))])


def method_table(cells: list[Cell]) -> pd.DataFrame:
    """One row per (cell, method): the engine, sampling and load it ran at, its speed-up, decode speed-up,
    acceptance and verdict (AR's row: its own output tok/s)."""
    out = []
    for cell in cells:
        for r in cell.rows[cell.rows["category"] == ALL].to_dict("records"):
            row = {"run": cell.source or cell.name, "engine": cell.engine, "sampling": _t(cell.temperature),
                   "c": cell.concurrency, "method": method_label(r["method"], cell.drafter)}
            if r["method"] == BASELINE:
                out.append({**row, "speed-up": f"1 ({r['output_throughput']:.1f} tok/s)", "decode speed-up": "",
                            "accepted": "", "verdict": ""})
                continue
            out.append({**row, "speed-up": _speedup(r), "decode speed-up": _speedup(r, "decode_speedup"),
                        "accepted": _pct(r["acceptance"]), "verdict": judged(r["speedup_ci95_lo"],
                                                                             r["speedup_ci95_hi"])})
    return pd.DataFrame(out)


def category_table(cell: Cell) -> pd.DataFrame:
    """Speed-up per category (rows: methods), with the interval over that category's prompts."""
    rows = cell.rows[cell.rows["method"] != BASELINE]
    out = []
    for method in dict.fromkeys(rows["method"]):
        mine = rows[rows["method"] == method].set_index("category")
        out.append({"method": method_label(method, cell.drafter),
                    **{c: _speedup(mine.loc[c]) for c in mine.index}})
    return pd.DataFrame(out)


def write(results: Path, references: list[Path]) -> str:
    """TABLES.md of ``results``: recommendations, a table per language, per category, load and the other cells."""
    cells = [read_cell(p) for p in runs_below(results)]
    by_key = {(c.language, c.temperature): c for c in cells if c.concurrency == 1}
    for ref in references:
        for path in runs_below(ref):
            probe = read_cell(path)
            mine = by_key.get((probe.language, probe.temperature))
            if mine is not None and (probe.engine, probe.concurrency) not in {(c.engine, c.concurrency) for c in cells
                                                                           if c.key[1:3] == probe.key[1:3]}:
                cells.append(read_cell(path, only=mine.prompts, source=f"{ref.name}/{path.name}"))
    lines = [f"# {results.name}: tables", "",
             f"Generated by `python -m analysis.engine_grid {_rel(results)}"
             + "".join(f" --reference {_rel(r)}" for r in references) + "` from the run directories below; do not "
             "edit. Speed-up: output tokens per wall second over AR's, paired 95% interval, prompts as the unit; "
             "decode: the same without TTFT; accepted: accepted / drafted tokens.", "",
             "## Recommendation per cell", "",
             "A method pays where its speed-up's 95% lower bound is above 1, loses where the upper bound is below 1, "
             "else it is not resolved; the recommendation is the paying method with the highest estimate (none "
             "paying: no speculation).", ""]
    rec = pd.DataFrame([{"engine": c.engine, "language": c.language, "sampling": _t(c.temperature),
                         "concurrency": c.concurrency, "prompts": len(c.prompts), "AR tok/s": f"{c.ar_tok_s:.1f}"
                         if c.ar_tok_s else "-", "recommendation": recommendation(c),
                         "run": c.source or c.name} for c in sorted(cells, key=_order)])
    lines += [markdown(rec), ""]
    for language in dict.fromkeys(c.language for c in sorted(cells, key=_order)):
        mine = [c for c in sorted(cells, key=_order) if c.language == language]
        lines += [f"## {language}", "", markdown(method_table(mine)), ""]
        for cell in mine:
            table = category_table(cell)
            if len(table) and len(table.columns) > 2:
                lines += [f"### {language}, {cell.engine}, {_t(cell.temperature)}, concurrency {cell.concurrency}: "
                          f"speed-up per category ({cell.source or cell.name})", "", markdown(table), ""]
    return "\n".join(lines).rstrip() + "\n"


def _order(cell: Cell) -> tuple[Any, ...]:
    return (cell.language, cell.engine.startswith("spectune"), not cell.engine.endswith("Q4_1"), cell.concurrency,
            cell.temperature, cell.name)


def _rel(path: Path) -> str:
    """``path`` as the command that wrote a table names it: relative to the repository where it lies inside."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a folder of bench run directories")
    parser.add_argument("--reference", type=Path, action="append", default=[],
                        help="another folder of runs, read on the same prompts as the grid's cells")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {TABLES} differs from what the runs give")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for folder in [args.results, *args.reference]:
        if not folder.is_dir() or not runs_below(folder):
            log.error(f"error: {folder} holds no bench run directory (summary.json, requests.parquet, metadata.json)")
            return 2
    text = write(args.results, args.reference)
    target = args.results / TABLES
    if args.check:
        same = target.exists() and target.read_text() == text
        log.info(f"{target}: {'up to date' if same else 'differs from what the runs give'}")
        return 0 if same else 1
    target.write_text(text)
    log.info(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
