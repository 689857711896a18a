"""The front page's results: one row per question the committed runs answer, and a conclusion whose every sentence
is composed from the same runs' figures.

A question names the run directories that answer it (``QUESTIONS``); everything else — the answer's figures and
intervals, whether a draft is faster or slower than AR, which adaptive policy beat the best fixed γ, the coverage
counts, the pair, sampling and machine — is read from the runs' own files (``summary.json``,
``recommendation.json``, ``comparison.parquet``, ``coverage.json``, ``metadata.json``). Where a run directory
also holds ``<name>.at-registration.json``, that file is the registered reading and ``<name>.json`` a later one,
made with an interval developed after the data were seen: the answer shows both, labelled so.
``python -m analysis.results_index`` writes the table and the conclusion into README.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from scipy import stats

from analysis.load import fixed_gamma
from spectune.errors import SpectuneError
from spectune.methods import BASELINE, Method, is_label
from spectune.run import rundir
from spectune.stats.by_category import ALL

logger = logging.getLogger(__name__)

REGISTERED_SUFFIX = ".at-registration"  # <name>.at-registration.json: the reading made by the registered code
SKIP = {BASELINE, "ar (A/A)", "best fixed γ"}  # comparison rows that are not adaptive policies


@dataclass(frozen=True)
class Answer:
    """One question's row and its sentence of the conclusion; ``runs`` relative to the results folder."""

    question: str
    setting: str
    text: str
    sentence: str
    runs: tuple[str, ...]


@dataclass(frozen=True)
class Ratio:
    """A speed-up over a baseline with its 95% interval; ``label`` says of what."""

    label: str
    value: float
    lo: float | None
    hi: float | None

    @property
    def side(self) -> int:
        """1: faster than the baseline (the interval above 1), -1: slower (below), 0: not resolved."""
        if self.lo is not None and self.lo > 1:
            return 1
        return -1 if self.hi is not None and self.hi < 1 else 0

    def text(self) -> str:
        return speedup(self.value, self.lo, self.hi)


def interval(lo: Any, hi: Any, fmt: str) -> str:
    """`` [lo, hi]`` in ``fmt``, or nothing where a bound is missing or NaN."""
    if lo is None or hi is None or lo != lo or hi != hi:
        return ""
    return f" [{format(lo, fmt)}, {format(hi, fmt)}]"


def speedup(value: float, lo: Any = None, hi: Any = None) -> str:
    return f"{value:.2f}×{interval(lo, hi, '.2f')}"


def pct(value: float, lo: Any = None, hi: Any = None) -> str:
    return f"{value:+.1f}%{interval(lo, hi, '+.1f')}"


def machine(hardware: dict[str, Any], host: dict[str, Any], short: bool = False) -> str:
    """The machine a run measured on, from its recorded hardware and host (``short``: without the CPU flags)."""
    device = str(hardware.get("device", "cpu"))
    threads = hardware.get("torch_threads", host.get("torch_threads"))
    path = hardware.get("execution_path") or ("compiled" if hardware.get("compile") else "eager")
    dtype = hardware.get("dtype", "?")
    if device.startswith("cuda"):
        name = hardware.get("device_name") or hardware.get("gpu_name") or "GPU (name not recorded)"
        return f"{name}, {dtype}, {path}"
    cores = host.get("cpu_count", "?")
    if "cpu_model" in hardware:
        recorded = hardware.get("cpu_flags")
        vector = " ".join(recorded) if isinstance(recorded, list) else hardware.get("cpu_capability", "?")
        flags = "" if short else f" ({vector}; bf16 {hardware.get('cpu_bf16', '?')})"
        cpu = f"{cores}-vCPU {hardware['cpu_model']}{flags}"
    else:
        cpu = f"{cores}-vCPU {host.get('processor', '?')}{'' if short else ' (CPU model and flags not recorded)'}"
    return f"{cpu}, {dtype}, {threads} thread{'' if threads == 1 else 's'}{'' if short else f', {path}'}"


def draft_of(meta: dict[str, Any]) -> str:
    """What drafted, in a word or two: a server engine's name (its methods name their types), the configured
    proposer, else the draft model's kind."""
    engine = (meta.get("engine") or {}).get("engine")
    if engine and engine != "spectune":
        return {"llamacpp": "llama.cpp", "vllm": "vLLM", "sglang": "SGLang"}.get(engine, engine)
    name = ((meta.get("config") or {}).get("proposer") or {}).get("name")
    if name in {"lookup", "suffix"}:
        return {"lookup": "prompt lookup", "suffix": "suffix decoding"}[name]
    draft = (meta.get("models") or {}).get("draft") or {}
    return "feature draft" if draft.get("reads_target_features") else "draft model"


def _language(meta: dict[str, Any]) -> str:
    return str((meta.get("workload") or (meta.get("workloads") or [{}])[0]).get("name", "?"))


def _sampling(meta: dict[str, Any]) -> str:
    wl = meta.get("workload") or (meta.get("workloads") or [{}])[0]
    temp = (wl.get("sampling") or meta.get("sampling") or {}).get("temperature")
    return "greedy" if temp == 0 else f"T = {temp:g}" if isinstance(temp, int | float) else "T ?"


def _setting(metas: Iterable[dict[str, Any]], sentence: bool = False) -> str:
    """The pair(s), languages and sampling of a question's runs: the table's cell, or (``sentence``) the phrase
    that opens the conclusion's sentence."""
    metas = list(metas)
    pairs = ", ".join(dict.fromkeys(str((m.get("models") or {}).get("name", "?")) for m in metas))
    langs = ", ".join(dict.fromkeys(_language(m) for m in metas))
    modes = ", ".join(dict.fromkeys(_sampling(m) for m in metas))
    return f"With {pairs} ({langs}; {modes})" if sentence else f"{pairs}; {langs}; {modes}"


def _span(ratios: list[Ratio]) -> str:
    values = sorted(r.value for r in ratios)
    return f"{values[0]:.2f}×" if len(values) == 1 or f"{values[0]:.2f}" == f"{values[-1]:.2f}" else (
        f"{values[0]:.2f}–{values[-1]:.2f}×")


def _verdict(ratios: list[Ratio]) -> str:
    """Faster or slower than AR beyond the interval in every run, or what else the intervals say."""
    sides = [r.side for r in ratios]
    runs = f"all {len(sides)} runs" if len(sides) > 1 else "its run"
    if set(sides) == {1}:
        return f"faster than AR in {runs}"
    if set(sides) == {-1}:
        return f"slower than AR in {runs}"
    faster, slower = sides.count(1), sides.count(-1)
    unresolved = len(sides) - faster - slower
    return f"faster than AR in {faster}, slower in {slower}, not resolved in {unresolved} of {len(sides)} runs"


# ---- the kinds of question -------------------------------------------------------------------------------------

def speculation(runs: list[Path], root: Path) -> tuple[str, str, str]:
    """task=bench runs: each speculative method's decode speed-up over AR (all categories pooled), by draft and γ."""
    groups: dict[str, list[Ratio]] = {}
    metas = []
    for run in runs:
        meta = rundir.METADATA.read(run)
        metas.append(meta)
        rows = [r for r in rundir.SUMMARY.read(run).get("by_category", []) if r.get("category") == ALL]
        if not rows:
            raise SpectuneError(f"{run / rundir.SUMMARY.name} has no per-category rows: not a bench run over "
                                "several prompt categories")
        for r in rows:
            if not is_label(r["method"]) or not Method.parse(r["method"]).speculative:
                continue
            method = Method.parse(r["method"])
            kind = draft_of(meta) if method.is_fixed else f"{draft_of(meta)} {method.name}"
            key = f"{kind} γ {method.gamma}"
            groups.setdefault(key, []).append(Ratio(_language(meta), r["decode_speedup"],
                                                    r.get("decode_speedup_ci95_lo"), r.get("decode_speedup_ci95_hi")))
    every = [r for ratios in groups.values() for r in ratios]
    cells = "; ".join(f"{key}: " + ", ".join(f"{r.label} {r.text()}" for r in ratios) for key, ratios in groups.items())
    text = f"{_verdict(every)}: {cells} (decode speed-up over AR)"
    names = list(groups)
    sentence = (f"{_setting(metas, True)}, {' and '.join(names)} decode{'s' if len(names) == 1 else ''} "
                f"{_verdict(every)} ({', '.join(f'{_span(groups[n])}' for n in names)}).")
    return _setting(metas), text, sentence


def adaptive(runs: list[Path], root: Path) -> tuple[str, str, str]:
    """policies.evaluate runs: per run and concurrency, the adaptive policy with the highest decode rate against the
    grid's best fixed γ, with its paired interval and verdict."""
    won, lost, metas = [], [], []
    for run in runs:
        meta = rundir.METADATA.read(run)
        metas.append(meta)
        frame = rundir.COMPARISON.read(run)
        for conc, rows in frame.groupby("concurrency", sort=True):
            policies = rows[~rows["policy"].isin(SKIP) & ~fixed_gamma(rows["policy"])]
            if policies.empty:
                continue
            top = policies.loc[policies["decode_vs_best_fixed_pct"].idxmax()]
            where = f"{draft_of(meta)}, {_language(meta)}, c{conc}, {run.relative_to(root).parts[0]}"
            figure = pct(top["decode_vs_best_fixed_pct"], top["decode_vs_best_fixed_pct_ci95_lo"],
                         top["decode_vs_best_fixed_pct_ci95_hi"])
            entry = f"{top['policy']} {figure} ({where})"
            (won if top.get("decode_vs_best_fixed_verdict") == "faster" else lost).append((entry, top["policy"]))
    total = len(won) + len(lost)
    text = (f"faster than the best fixed γ in {len(won)} of {total} comparisons: "
            + ("; ".join(e for e, _ in won) or "none") + f". Not resolved faster in the other {len(lost)}")
    names = sorted({p for _, p in won})
    sentence = (f"{_setting(metas, True)}, an adaptive policy decoded faster than the grid's best fixed γ beyond its "
                f"interval in {len(won)} of {total} comparisons" + (f" ({', '.join(names)})" if names else "")
                + f"; in the other {len(lost)} none was resolved faster.")
    return _setting(metas), text, sentence


def _phase_regime(phase: dict[str, Any]) -> tuple[float, int]:
    """A phase's (temperature, concurrency): its one sampling setting and its rows."""
    mix = phase.get("sampling_mix") or []
    if len(mix) != 1:
        raise SpectuneError(f"phase {phase.get('name')!r} mixes {len(mix)} sampling settings: no single regime")
    return float(mix[0]["temperature"]), int(phase["concurrency"])


def regime_map(runs: list[Path], root: Path) -> tuple[str, str, str]:
    """Held-out runs of a phased workload beside a per-regime map (``policy=regime-map`` in ``task.compare``, its
    JSON next to the run, chosen on training prompts by ``policies.static_answers``): per phase, what the map runs
    (a fixed γ or off) and its held-out throughput speed-up over AR with the 95% interval."""
    cells, metas = [], []
    for run in runs:
        meta = rundir.METADATA.read(run)
        metas.append(meta)
        entry = next((e for e in (meta.get("config") or {}).get("task", {}).get("compare") or []
                      if e.get("name") == "regime-map"), None)
        if entry is None:
            raise SpectuneError(f"{run} compares no regime-map: not a held-out run of a per-regime map")
        chosen = {(float(r["temperature"]), int(r["concurrency"])): int(r["gamma"])
                  for r in rundir.read_json(run.parent / Path(entry["path"]).name)["regimes"]}
        rows = {r["phase"]: r for r in rundir.SUMMARY.read(run).get("by_phase", [])
                if is_label(r["method"]) and Method.parse(r["method"]).name == "regime-map"}
        parts = []
        for phase in meta["workload"]["phases"]:
            temperature, rows_at_once = _phase_regime(phase)
            gamma = chosen[(temperature, rows_at_once)]
            row = rows[phase["name"]]
            lo, hi = row.get("speedup_ci") or (None, None)
            mode = "greedy" if temperature == 0 else f"T = {temperature:g}"
            parts.append(f"{mode} c{rows_at_once} {'off' if gamma == 0 else f'γ {gamma}'} "
                         f"{speedup(row['speedup'], lo, hi)}")
        cells.append(f"{meta['workload'].get('language', _language(meta))}: " + "; ".join(parts))
    text = "; ".join(cells) + f" (map chosen on training prompts; held-out speed-up over AR, {draft_of(metas[0])})"
    pairs = ", ".join(dict.fromkeys(str((m.get("models") or {}).get("name", "?")) for m in metas))
    langs = ", ".join(dict.fromkeys(str(m["workload"].get("language", _language(m))) for m in metas))
    sentence = (f"With {pairs} ({langs}; {draft_of(metas[0])}), the best fixed γ chosen per temperature and "
                f"concurrency on training prompts gave, held out: {'; '.join(cells)}.")
    return f"{pairs}; {langs}; greedy, T = 1", text, sentence


def _coverage_counts(runs: list[Path], name: str) -> tuple[int, int, bool]:
    """Intervals that contained no difference and all of them, summed over runs, from ``name`` (coverage.json or
    its registered copy); False when a run lacks that file."""
    hits = total = 0
    for run in runs:
        path = run / name
        if not path.is_file():
            return 0, 0, False
        summary = rundir.read_json(path).get("summary") or {}
        key = next((k for k in summary if k.startswith("no difference")), None)
        if key is None:
            raise SpectuneError(f"{path} has no 'no difference' comparison: not a finished coverage run")
        hits += int(summary[key]["contain_no_difference"])
        total += int(summary[key]["comparisons"])
    return hits, total, True


def _share(hits: int, total: int) -> str:
    ci = stats.binomtest(hits, total).proportion_ci(0.95, method="exact")
    return f"{hits} of {total} ({100 * hits / total:.1f}%{interval(100 * ci.low, 100 * ci.high, '.1f')})"


def coverage(runs: list[Path], root: Path) -> tuple[str, str, str]:
    """task=coverage runs, grouped by results folder: the registered reading (the ``.at-registration`` copy where
    one exists, else the run's own file) and, where the run was read again later, that exploratory reading."""
    folders: dict[str, list[Path]] = {}
    for run in runs:
        folders.setdefault(run.relative_to(root).parts[0], []).append(run)
    registered, later, metas = [], [], []
    current = rundir.COVERAGE.name
    first = current.replace(".json", f"{REGISTERED_SUFFIX}.json")
    for folder, members in folders.items():
        metas += [rundir.COVERAGE.read(r).get("workers") or {} for r in members]
        hits, total, again = _coverage_counts(members, first)
        if again:
            registered.append(f"{_share(hits, total)} ({folder})")
            later.append(f"{_share(*_coverage_counts(members, current)[:2])} ({folder})")
        else:
            registered.append(f"{_share(*_coverage_counts(members, current)[:2])} ({folder})")
    text = "registered: " + "; ".join(registered) + " no-difference intervals contain 0 (95% nominal)"
    if later:
        text += "; exploratory, an interval developed after these data were seen: " + "; ".join(later)
    counts = " and ".join(r.split(" (")[0] for r in registered)
    sentence = (f"{_setting(metas, True)}, the registered coverage readings found {counts} no-difference intervals "
                "containing 0.")
    return _setting(metas), text, sentence


# ---- the questions ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Question:
    """A question the front page answers, the kind of answer, and the run directories (globs under the results
    folder) that answer it."""

    text: str
    answer: Callable[[list[Path], Path], tuple[str, str, str]]
    runs: tuple[str, ...]


LLAMACPP_GRID = "llamacpp-grid-smollm2-quiet-cpu-20261207"  # its language tables: ngram-t<T>-<language>, concurrency 1
QUESTIONS = (
    Question("Does a draft without a model pay on real tasks?", speculation,
             ("lookup-timed-smollm2-cpu-20261205/greedy-*", "suffix-timed-smollm2-cpu-20261206/greedy-*")),
    Question("Does it pay when sampling?", speculation,
             ("lookup-timed-smollm2-cpu-20261205/t1-*", "suffix-timed-smollm2-cpu-20261206/t1-*")),
    Question("Does a draft model pay on the same tasks?", speculation,
             ("model-drafts-tasks-smollm2-cpu-20261206/*-*",)),
    Question("Does it pay on llama.cpp (its n-gram drafts)?", speculation, (f"{LLAMACPP_GRID}/ngram-t0-??",)),
    Question("And on llama.cpp when sampling?", speculation, (f"{LLAMACPP_GRID}/ngram-t1-??",)),
    Question("Which γ at which load and temperature?", regime_map,
             ("adaptive-regimes-batch-edge-it-*/held-out-*", "adaptive-regimes-no-probe-en-*/held-out-*")),
    Question("Does an adaptive γ beat the best fixed γ?", adaptive,
             ("adaptive-lookup-smollm2-cpu-20261206/evaluate-*", "adaptive-suffix-smollm2-cpu-20261206/evaluate-*",
              "shadow-trials-suffix-smollm2-cpu-20261206/evaluate-*")),
    Question("Do the 95% intervals keep their promise?", coverage,
             ("coverage-tiny-cpu-20261204/*", "coverage-tiny-r3-cpu-20261204/*")),
)


def runs_of(question: Question, root: Path) -> list[Path]:
    """The run directories under ``root`` (the results folder) that answer ``question``, sorted."""
    return sorted({p for pattern in question.runs for p in root.glob(pattern)
                   if p.is_dir() and rundir.METADATA.exists(p)})


def answers(root: Path) -> list[Answer]:
    """The answer of every question whose runs are under ``root`` (the results folder); a question without
    committed runs has no row."""
    out = []
    for q in QUESTIONS:
        runs = runs_of(q, root)
        if not runs:
            logger.info("no run directory under %s for %r (%s)", root, q.text, ", ".join(q.runs))
            continue
        setting, text, sentence = q.answer(runs, root)
        out.append(Answer(q.text, setting, text, sentence, tuple(r.relative_to(root).as_posix() for r in runs)))
    return out


def machines(root: Path) -> list[str]:
    """The machines the questions' runs measured on (short form), in order of first appearance."""
    seen: list[str] = []
    for q in QUESTIONS:
        for run in runs_of(q, root):
            meta = rundir.METADATA.read(run)
            if meta.get("task") == "coverage":
                meta = rundir.COVERAGE.read(run).get("workers") or {}
            seen.append(machine(meta.get("hardware") or {}, meta.get("host") or {}, short=True))
    return list(dict.fromkeys(seen))


def headline_table(root: Path, link_prefix: str | None) -> str:
    """The front page's table: one row per question; its runs' folders linked under ``link_prefix`` (None: named
    as code, for a page outside the repository's tree)."""
    lines = ["| question | setting (pair; language; sampling) | answer (95% CI) | runs |", "| --- | --- | --- | --- |"]
    for a in answers(root):
        folders = list(dict.fromkeys(r.split("/")[0] for r in a.runs))
        links = ", ".join(f"[{f}]({link_prefix}{f}/)" if link_prefix is not None else f"`bench/results/{f}`"
                          for f in folders)
        lines.append(f"| {a.question} | {a.setting} | {a.text.replace('|', '/')} | {links} |")
    return "\n".join(lines)


def conclusion(root: Path) -> str:
    """The conclusion: the machines, then one sentence per question, every figure from the runs."""
    where = machines(root)
    if not where:
        return "No committed run answers these questions."
    head = (f"Measured on {where[0]}" if len(where) == 1 else "Measured on " + "; ".join(where)) + "."
    return " ".join([head, *(a.sentence for a in answers(root))])


def frame(root: Path) -> pd.DataFrame:
    """The answers as a table (question, setting, text, sentence, runs), for notebooks and tests."""
    return pd.DataFrame([a.__dict__ for a in answers(root)])
