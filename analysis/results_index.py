"""The index of the committed results: one row per run directory under ``bench/results/``.

    python -m analysis.results_index            # write the tables (below) from the run directories
    python -m analysis.results_index --check    # exit 1 if a committed table differs from what the runs give

A run directory is one the product wrote: ``metadata.json`` (``python -m harness`` tasks, ``policies.evaluate``)
or ``acceptance.json`` (``task=acceptance``, which carries its metadata inside). Folders below a run directory
belong to it; ``archive/`` holds superseded explorations and is listed by file, not read. Every figure in the
tables is read from the run's own files (``summary.json``, ``recommendation.json``, ``comparison.parquet``,
``acceptance.json``); nothing is typed in. Written, between their markers:

- ``bench/results/README.md``: the whole index (date, machine, pair, proposer, task and workload, command,
  headline figures with their 95% intervals, link);
- ``README.md``: the headline table, one row per question the current runs answer, and the conclusion, every
  sentence of it composed from the runs (:mod:`analysis.headlines`);
- ``docs/results.md``: the same, and the short table of every run;
- ``bench/results/archive/README.md``: one line per archived entry and one per probe that left
  ``bench/`` (``archive/probes.json``; :mod:`analysis.results_archive`).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.headlines import REGISTERED_SUFFIX, conclusion, headline_table, interval, machine, pct, speedup
from analysis.policy_table import AA_POLICY, BEST_FIXED
from analysis.results_archive import archive_page
from spectune.engine import proposers
from spectune.errors import SpectuneError
from spectune.methods import BASELINE, Method, is_fixed_label, is_label
from spectune.run import rundir

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path("bench/results")
ARCHIVE = "archive"
BEGIN = "<!-- results-index:begin (python -m analysis.results_index writes this table) -->"
END = "<!-- results-index:end -->"
HEADLINE_BEGIN = "<!-- results-headline:begin (python -m analysis.results_index writes this table and conclusion) -->"
HEADLINE_END = "<!-- results-headline:end -->"
COMMANDS = {"evaluate": "python -m policies.evaluate", "train": "python -m policies.train"}
PROSE_WIDTH = 120  # a page's prose lines at most (a table's row is one line, however long)
# a word that, first on a line, would turn a paragraph's line into a list item, heading, quote or rule
BLOCK_MARKER = re.compile(r"[-+*]|\d{1,9}[.)]|#{1,6}|>.*|=+|-+")
RUN_FILES = (rundir.METADATA.name, rundir.ACCEPTANCE.name)


@dataclass(frozen=True)
class Run:
    """What the index says about one run directory."""

    path: str  # relative to the results folder, with "/"
    date: str
    machine: str
    pair: str
    proposer: str
    task: str
    workload: str
    command: str
    headline: str  # the whole index's figures
    short: str  # the short table's figures


def find_runs(root: Path) -> list[Path]:
    """Every run directory below ``root`` (not below another run, not in ``archive/``), in path order."""
    out: list[Path] = []

    def walk(folder: Path) -> None:
        if any((folder / name).is_file() for name in RUN_FILES):
            out.append(folder)
            return
        for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if folder == root and child.name == ARCHIVE:
                continue
            walk(child)

    walk(root)
    return out


def _overrides(run: Path) -> list[str] | None:
    for name in (".hydra/overrides.yaml", "overrides.yaml"):
        path = run / name
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            return [line[2:].strip() for line in lines if line.startswith("- ")]
    return None


def _proposer(models: dict[str, Any], config: dict[str, Any] | None = None) -> str:
    return proposers.label((config or {}).get("proposer"), models)


def _workload(meta: dict[str, Any]) -> str:
    wl = meta.get("workload") or (meta.get("workloads") or [{}])[0]
    sampling = wl.get("sampling") or meta.get("sampling") or {}
    temp = sampling.get("temperature")
    mode = "greedy" if temp == 0 else f"T = {temp:g}" if isinstance(temp, int | float) else "T ?"
    if wl.get("phases"):  # each phase samples its own way: name the phases instead
        mode = f"phases {', '.join(str(p.get('name')) for p in wl['phases'])}"
    names = [w.get("name", "?") for w in meta.get("workloads", [])] or [wl.get("name", "?")]
    return f"{','.join(names)}, {wl.get('num_prompts', '?')} prompts, {mode}"


OLD_UNIT = " [intervals over (repeat, prompt) cells: made before prompts were the unit, too narrow]"


def _bench(run: Path) -> tuple[str, str]:
    summary = rundir.SUMMARY.read(run)
    methods = [m for m in summary.get("methods", []) if m.get("status") == "ok"]
    best = next((m for m in methods if m.get("best")), None)
    if best is None:
        raise SpectuneError(f"{run / rundir.SUMMARY.name} has no method marked best: not a finished bench run")
    like = [m["method"] for m in methods if m.get("indistinguishable_from_best") and m is not best]
    resolved = ((summary.get("ranking") or {}).get("output_throughput") or {}).get("best_resolved", True)
    fig = _best(best, methods, resolved)
    full = f"{fig}; indistinguishable: {', '.join(like) or 'none'}; repeats {summary.get('repeats')}"
    floor = summary.get("noise_floor_pct")
    if floor is not None:
        full += f"; noise floor {floor:.1f}%"
    flagged = (summary.get("conditions") or {}).get("flagged_repeats") or []
    full += f"; repeats flagged for other load: {len(flagged)} of {summary.get('repeats')}"
    if "ci_method" in (summary.get("statistics") or {}):
        full, fig = full + OLD_UNIT, fig + OLD_UNIT
    return full, fig


def _ratio(method: dict[str, Any]) -> str:
    if method.get("speedup") is None:  # a grid run without its own AR (task.baseline=false)
        return f"{method['output_throughput']:.1f} tok/s (no AR in this run)"
    return f"{speedup(method['speedup'], method.get('speedup_ci95_lo'), method.get('speedup_ci95_hi'))} AR"


def _best(best: dict[str, Any], methods: list[dict[str, Any]], resolved: bool) -> str:
    """The bench's top method; where that is AR, the fastest speculative method's speed-up beside it (a loss is a
    result too)."""
    rank = "best" if resolved else "top (not resolved)"
    if not is_label(best["method"]) or Method.parse(best["method"]).speculative:
        return f"{rank} {best['method']}: {_ratio(best)}"
    spec = [m for m in methods if is_label(m["method"]) and Method.parse(m["method"]).speculative]
    if not spec:
        return f"{rank} {best['method']}: no speculative method ran"
    top = max(spec, key=lambda m: m["speedup"])
    if resolved:
        return f"no speculative method beats AR: best {top['method']} {_ratio(top)}"
    return f"top (not resolved) AR; best speculative {top['method']} {_ratio(top)}"


def _tune(run: Path) -> tuple[str, str]:
    rec = rundir.RECOMMENDATION.read(run)
    cells = []
    for r in rec.get("recommendations", []):
        if r.get("status") != "ok":
            cells.append(f"c{r['concurrency']} {r.get('status')}")
            continue
        g = r["best_gamma"]
        ratio = speedup(r["speedup"], r.get("speedup_ci95_lo"), r.get("speedup_ci95_hi"))
        what = "AR" if g == 0 else f"γ = {g} {ratio}"
        cells.append(f"c{r['concurrency']} {what}")
    vllm = [f"{lang}: `{v['speculative_config']['num_speculative_tokens_per_batch_size']}`"
            for lang, v in sorted((rec.get("vllm") or {}).items())]
    short = "best γ by concurrency: " + "; ".join(cells)
    full = short + (f"; vLLM `num_speculative_tokens_per_batch_size` {', '.join(vllm)}" if vllm else "")
    if any("ci_method" in (r.get("statistics") or {}) for r in rec.get("recommendations", [])):
        full, short = full + OLD_UNIT, short + OLD_UNIT
    return full, short


def _evaluate(run: Path) -> tuple[str, str]:
    frame = rundir.COMPARISON.read(run)
    parts_full, parts_short = [], []
    for conc, rows in frame.groupby("concurrency", sort=True):
        by = {r["policy"]: r for r in rows.to_dict("records")}
        best = by.get("best fixed γ")
        if best is None:
            raise SpectuneError(f"{run / rundir.COMPARISON.name} has no 'best fixed γ' row at concurrency {conc}")
        head = f"c{conc}: best fixed γ = {int(best['gamma'])} {best['decode_speedup_vs_ar']:.2f}× AR (decode)"
        full, short = [head], [head]
        aa = by.get(AA_POLICY)
        if aa is not None:
            note = (f"A/A {pct(aa['decode_vs_ar_pct'])}"
                    f"{interval(aa['decode_vs_ar_pct_ci95_lo'], aa['decode_vs_ar_pct_ci95_hi'], '+.1f')}")
            full.append(note)
            short.append(note)
        skip = {BASELINE, AA_POLICY, BEST_FIXED}
        adaptive = [r for name, r in by.items() if name not in skip and not is_fixed_label(name)]
        for r in adaptive:
            full.append(f"{r['policy']} {_vs_best(r)}")
        if adaptive:
            top = max(adaptive, key=lambda r: r["decode_vs_best_fixed_pct"])
            verdict = top.get("decode_vs_best_fixed_verdict")
            rank = "faster" if verdict == "faster" else "top estimate"  # "best" only where its interval says so
            short.append(f"{rank}: {top['policy']} {_vs_best(top)} vs best fixed"
                         + (f", {verdict}" if isinstance(verdict, str) and verdict != "faster" else ""))
        parts_full.append("; ".join(full))
        parts_short.append("; ".join(short))
    old = "" if "unit" in frame else OLD_UNIT
    return " — ".join(parts_full) + " (decode tok/s, % vs best fixed γ)" + old, " — ".join(parts_short) + old


def _vs_best(row: dict[str, Any]) -> str:
    """A policy's decode tok/s against the best fixed γ, % with its paired interval."""
    ci = interval(row["decode_vs_best_fixed_pct_ci95_lo"], row["decode_vs_best_fixed_pct_ci95_hi"], "+.1f")
    return f"{pct(row['decode_vs_best_fixed_pct'])}{ci}"


def registered(run: Path, root: Path) -> bool:
    """Whether the run's readings were registered before it ran: a REGISTERED.md in its folder or one above it,
    up to the results folder."""
    return any((folder / "REGISTERED.md").is_file() for folder in (run, *run.parents)
               if folder == root or root in folder.parents)


def _coverage_reading(summary: dict[str, Any], where: Path) -> tuple[str, dict[str, Any]]:
    name = next((k for k in summary if k.startswith("no difference")), next(iter(summary), None))
    if name is None:
        raise SpectuneError(f"{where} has no comparison: not a finished coverage run")
    r = summary[name]
    ci = interval(100 * r["coverage_ci95"][0], 100 * r["coverage_ci95"][1], ".0f")
    return f"{name}: {r['contain_no_difference']}/{r['comparisons']} contain 0{ci}%", r


def _coverage(run: Path, root: Path) -> tuple[str, str]:
    """task=coverage: the share of no-difference intervals that contained it, with its exact binomial interval,
    beside the old (repeat, prompt) unit on the same runs. A registered run's reading says so; where the run was
    read again later (its ``coverage.at-registration.json`` is the registered reading), the later reading is
    labelled exploratory."""
    summary = rundir.COVERAGE.read(run).get("summary") or {}
    fig, r = _coverage_reading(summary, run / rundir.COVERAGE.name)
    first = run / rundir.COVERAGE.name.replace(".json", f"{REGISTERED_SUFFIX}.json")
    if first.is_file():
        then, _ = _coverage_reading(rundir.read_json(first).get("summary") or {}, first)
        fig = f"registered: {then}; exploratory (an interval developed after these data were seen): {fig}"
    elif registered(run, root):
        fig = f"registered: {fig}"
    full = (f"{fig}; units only {r.get('units_only_contain', '?')}/{r['comparisons']}; old unit "
            f"{r['old_unit_contain']}/{r['comparisons']}; median width {r['median_width_pct']:.1f}%, MDE "
            f"{r['median_mde_pct']:.1f}%")
    if "policy" in summary:
        p = summary["policy"]
        full += f"; policy doing γ's work {p['contain_no_difference']}/{p['comparisons']} contain 0"
    return full, fig


def _predict(run: Path) -> tuple[str, str]:
    """task=predict: the γ with the highest predicted speed-up overall (a prediction: no clock read it), with the
    copyable fraction; the full line adds each γ's prediction."""
    result = rundir.PREDICTION_SUMMARY.read(run)
    overall = {r["gamma"]: r for r in result.get("by_category", []) if r["category"] == "all"}
    if not overall:
        raise SpectuneError(f"{run / rundir.PREDICTION_SUMMARY.name} has no 'all' row: not a finished predict run")
    copyable = f"copyable {next(iter(overall.values()))['copyable_fraction']:.2f}"
    if "predicted_speedup" not in next(iter(overall.values())):
        return f"{copyable}; no profile: no speed-up predicted", copyable
    best = max(overall, key=lambda g: overall[g]["predicted_speedup"])
    short = f"predicted (not timed): γ = {best} {overall[best]['predicted_speedup']:.2f}× AR (decode); {copyable}"
    full = short + "; by γ " + ", ".join(f"{g}: {r['predicted_speedup']:.2f}×" for g, r in sorted(overall.items()))
    return full, short


def _acceptance(result: dict[str, Any]) -> tuple[str, str]:
    ci = result.get("alpha_ci95_over_prompts") or {}
    fig = f"α {result['alpha']:.3f}{interval(ci.get('lo', ci.get('low')), ci.get('hi', ci.get('high')), '.3f')}"
    steps = result.get("alpha_by_draft_step") or []
    full = fig + " (95% CI over prompts)"
    if len(steps) > 1:
        full += "; by draft step " + " / ".join(f"{s:.3f}" for s in steps if isinstance(s, int | float))
    if result.get("c") is not None:
        full += f"; c {result['c']:.3f}"
    return full, fig


def describe(run: Path, root: Path) -> Run:
    """One run directory's row; a run the index cannot read is one line naming the file."""
    if (run / rundir.METADATA.name).is_file():
        meta = rundir.METADATA.read(run)
        task = str(meta.get("task", "?"))
        if task == "evaluate" or (run / rundir.COMPARISON.name).is_file():
            full, short = _evaluate(run)
        elif task == "tune":
            full, short = _tune(run)
        elif task == "bench":
            full, short = _bench(run)
        elif task == "predict":
            full, short = _predict(run)
        elif task == "coverage":
            meta = {**meta, **(rundir.COVERAGE.read(run).get("workers") or {})}  # the workers measured
            full, short = _coverage(run, root)
        else:
            full = short = f"no headline rule for task {task!r}: read the run's files"
    else:
        result = rundir.ACCEPTANCE.read(run)
        meta = {**result.get("metadata", {}), **{k: result[k] for k in ("models", "hardware", "workload")
                                                   if k in result}}
        task = "acceptance"
        full, short = _acceptance(result)
    models = meta.get("models") or {}
    overrides = _overrides(run)
    if overrides is None:
        command = _reconstructed(task, meta)
    else:
        command = f"{COMMANDS.get(task, 'python -m harness')} {' '.join(overrides)}".strip()
    return Run(
        path=run.relative_to(root).as_posix(),
        date=str(meta.get("created_utc", "?"))[:10],
        machine=machine(meta.get("hardware") or {}, meta.get("host") or {}),
        pair=str(models.get("name", "?")),
        proposer=_proposer(models, meta.get("config")),
        task=task,
        workload=_workload(meta),
        command=command,
        headline=full,
        short=short,
    )


def _reconstructed(task: str, meta: dict[str, Any]) -> str:
    """The command of a run that kept no overrides file, rebuilt from its recorded config (marked †)."""
    wl = meta.get("workload") or {}
    temp = (wl.get("sampling") or {}).get("temperature")
    parts = [f"python -m harness task={task}", f"models={(meta.get('models') or {}).get('name', '?')}",
             f"+workload={wl.get('name', '?')}", f"workload.num_prompts={wl.get('num_prompts', '?')}"]
    if temp == 0:
        parts.append("workload.sampling.temperature=0")
    return " ".join(parts) + " †"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def index_page(runs: Iterable[Run]) -> str:
    """``bench/results/README.md``: the whole index."""
    lines = [
        "# Results",
        "",
        "One row per run directory below this folder, written by `python -m analysis.results_index` from each",
        "run's own files (`metadata.json` or `acceptance.json`, and `summary.json`, `recommendation.json` or",
        "`comparison.parquet`); `tests/test_results_index.py` fails when this page and the runs disagree. Intervals",
        "are 95%; a speed-up is over autoregressive decoding (AR) on the same prompts (a bench or tune row's: pooled",
        "output throughput; an evaluate row's: decode tok/s); `c1`… is the concurrency. A command marked † was",
        "rebuilt from the run's recorded config (the run kept no overrides file). Paths are the repository's; the",
        "records are compacted (no per-token times or inter-token latencies, no cycle start times: the summaries hold",
        "those figures). Superseded explorations: [`archive/`](archive/README.md). To add a result:",
        "[docs/results.md](../../docs/results.md), Adding a result.",
        "",
        "| date | machine | pair | proposer | task, workload | command | headline (95% CI) | run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(
            f"| {r.date} | {_cell(r.machine)} | {r.pair} | {_cell(r.proposer)} | {r.task}: {_cell(r.workload)} "
            f"| `{_cell(r.command)}` | {_cell(r.headline)} | [{r.path}]({r.path}/) |"
        )
    return "\n".join(lines) + "\n"


def short_table(runs: Iterable[Run], link_prefix: str | None) -> str:
    """The short table: links under ``link_prefix`` (None: the path as code, for pages outside the tree)."""
    lines = ["| date | pair | task, workload | headline (95% CI) | run |", "| --- | --- | --- | --- | --- |"]
    for r in runs:
        where = f"[{r.path}]({link_prefix}{r.path}/)" if link_prefix is not None else f"`bench/results/{r.path}`"
        lines.append(f"| {r.date} | {r.pair} | {r.task}: {_cell(r.workload)} | {_cell(r.short)} | {where} |")
    return "\n".join(lines)


def splice(text: str, block: str, where: Path, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the part between the markers (the index's, or ``begin`` ... ``end``) replaced by ``block``."""
    if begin not in text or end not in text:
        raise SpectuneError(f"{where} has no generated-table markers ({begin!r} ... {end!r})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def outputs(repo: Path = REPO) -> dict[Path, str]:
    """Every file the index writes, with the text it should hold now."""
    root = repo / RESULTS
    runs = [describe(run, root) for run in find_runs(root)]
    if not runs:
        raise SpectuneError(f"no run directory under {root}")
    out = {root / "README.md": index_page(runs)}
    if (root / ARCHIVE).is_dir():
        out[root / ARCHIVE / "README.md"] = archive_page(root / ARCHIVE)
    readme, docs = repo / "README.md", repo / "docs" / "results.md"
    out[readme] = splice(readme.read_text(encoding="utf-8"), front(root, f"{RESULTS.as_posix()}/"), readme,
                         HEADLINE_BEGIN, HEADLINE_END)
    text = splice(docs.read_text(encoding="utf-8"), short_table(runs, None), docs)
    out[docs] = splice(text, front(root, None), docs, HEADLINE_BEGIN, HEADLINE_END)
    return out


def front(root: Path, link_prefix: str | None) -> str:
    """The headline table (one row per question) and the conclusion, both from the runs under ``root``."""
    return f"{headline_table(root, link_prefix)}\n\n{wrapped(conclusion(root))}"


def wrapped(paragraph: str, width: int = PROSE_WIDTH) -> str:
    """``paragraph`` in lines of at most ``width`` characters, broken at spaces only (a longer word stands on a
    line of its own), so that a page's source reads without scrolling; no line starts with a word Markdown would
    read as a block's marker (:data:`BLOCK_MARKER`): the word before it goes down with it."""
    lines: list[list[str]] = []
    line: list[str] = []
    for word in paragraph.split():
        if line and len(" ".join([*line, word])) > width:
            carried = [line.pop()] if BLOCK_MARKER.fullmatch(word) and len(line) > 1 else []
            lines.append(line)
            line = carried
        line.append(word)
    return "\n".join(" ".join(words) for words in [*lines, line])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.results_index", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    try:
        wanted = outputs(args.repo)
    except SpectuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"out of step: {p.relative_to(args.repo)} (run python -m analysis.results_index)")
        return 1 if stale else 0
    for p in stale:
        p.write_text(wanted[p], encoding="utf-8")
        print(f"wrote {p.relative_to(args.repo)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
