"""The registered readings of a held-out run of the adaptive-regimes design (docs/registration/adaptive-regimes.md
and adaptive-regimes-priced.md): the whole workload and each phase against AR, the best single static setting and
the controller, and the four goals, from the run directory and the static answers chosen on training prompts.

Each results folder's ``judge.py`` calls :func:`main` on its folder: every number comes from the held-out run's
``requests.parquet`` (``held-out-<language>/``, all methods interleaved in one grid) and the ``map-<language>.json``
of ``python -m policies.static_answers`` beside it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectune.methods import BASELINE
from spectune.run import rundir
from spectune.stats.by_phase import phase_intervals, phase_spans, workload_units
from spectune.stats.units import speedup_interval

CONTROLLER = "hysteresis:gamma=8"
MAP = "regime-map:gamma=8"
PPO = "ppo:gamma=8"
RULE = "match-length:gamma=8"
AR = BASELINE
NON_INFERIOR = 0.97  # goals 1, 3 and 4: lower 95% bound of the ratio
GAIN = 0.10  # goal 2: the controller's whole-workload gain over the best single static setting
PILOT_CUT = 12.0  # goal 3 takes its first form when the pilot's map gain is at least this (%)
SHARE = 0.8  # goal 3's second form: this share of the map's gain


def _pct(lo: float, hi: float) -> str:
    return f"[{100 * (lo - 1):+.1f}, {100 * (hi - 1):+.1f}]"


def _ratio(point: float, lo: float, hi: float) -> str:
    return f"{point:.2f}x [{lo:.2f}, {hi:.2f}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def static_label(answers: dict) -> str:
    """The best single static setting's label as the held-out run names it."""
    return str(answers["best_static"]["method"])


@dataclass(frozen=True)
class PhaseView:
    """One phase's requests, spans, each method's rate in it (tokens over its span) and its concurrency."""

    requests: pd.DataFrame
    spans: pd.DataFrame
    rate: dict[str, float]
    size: int

    def over(self, baseline: str) -> dict[str, list[float]]:
        """Each other method's [lo, hi] speed-up over ``baseline`` in this phase."""
        return phase_intervals(self.requests, self.spans, self.size, baseline)


def phase_views(requests: pd.DataFrame, concurrency: dict[str, int]) -> dict[str, PhaseView]:
    """Every phase's view, the spans computed once."""
    spans = phase_spans(requests)
    views = {}
    for phase, size in concurrency.items():
        mine = spans[spans["phase"] == phase]
        rate = {m: float(r.output_tokens.sum() / r.seconds.sum()) for m, r in mine.groupby("method")}
        views[phase] = PhaseView(requests[requests["phase"] == phase], mine, rate, size)
    return views


def per_phase(views: dict[str, PhaseView], over_ar: dict[str, dict[str, list[float]]], methods: list[str],
              static: str) -> list[str]:
    lines = []
    for phase, view in views.items():
        part, rate, size = view.requests, view.rate, view.size
        over_static, over_controller = view.over(static), view.over(CONTROLLER)
        units = part["request_id"].nunique() // size
        rows = []
        for m in methods:
            drafted = part[part["method"] == m]["drafted_tokens"].sum()
            accepted = part[part["method"] == m]["accepted_tokens"].sum()
            tokens = part[part["method"] == m]["output_tokens"].sum()
            ci_ar = _ratio(rate[m] / rate[AR], *over_ar[phase][m]) if m in over_ar[phase] else "1"
            ci_static = _ratio(rate[m] / rate[static], *over_static[m]) if m in over_static else "–"
            ci_ctl = _ratio(rate[m] / rate[CONTROLLER], *over_controller[m]) if m in over_controller else "–"
            acc = f"{accepted / drafted:.2f}" if drafted else "–"
            rows.append([m, f"{rate[m]:.1f}", ci_ar, ci_static, ci_ctl, f"{drafted / tokens:.2f}", acc])
        best = max((m for m in methods), key=lambda m: rate[m])
        lines += [f"### {phase} (concurrency {size}; {units} units of {size} prompt{'s' if size > 1 else ''})", ""]
        lines += _table(["method", "tok/s", "over AR [95% CI]", f"over {static}", f"over {CONTROLLER}",
                         "drafted per output token", "accepted per drafted"], rows)
        lines += ["", f"Best measured in this phase (the hindsight oracle among these methods): `{best}`, "
                      f"{rate[best] / rate[CONTROLLER]:.2f}x the controller.", ""]
    return lines


def judge(run: Path, answers_path: Path, language: str) -> str:
    """The tables and the goals' verdicts as Markdown (``language``: the prompts' language, in words)."""
    answers = json.loads(answers_path.read_text())
    metadata = rundir.METADATA.read(run)
    concurrency = {str(k): int(v) for k, v in metadata["settings"]["phases"].items()}
    requests = rundir.REQUESTS.read(run)
    methods = list(dict.fromkeys(requests["method"]))
    static = static_label(answers)
    units, views = workload_units(requests, concurrency), phase_views(requests, concurrency)
    over_ar = {phase: view.over(AR) for phase, view in views.items()}
    out = [f"# Tables: adaptive length across regimes, held-out {language} prompts", "",
           f"Written by `judge.py` from `{run.name}/` ({units.n} units over four phases) and `{answers_path.name}`. "
           f"Best single static setting on the training prompts: `{static}`; the map's gain over it there "
           f"(the pilot): {answers['map_vs_static_pct']:+.1f}%.", "", "## The whole workload", ""]
    rows = []
    for m in methods:
        point = units.rate(m) / units.rate(AR)
        ci = speedup_interval(units, m, AR) if m != AR else None
        rows.append([m, f"{units.rate(m):.1f}", _ratio(point, ci.lo, ci.hi) if ci else "1"])
    out += [*_table(["method", "tok/s (tokens over the phases' summed spans)", "over AR [95% CI]"], rows), ""]
    out += ["## Per phase", "", *per_phase(views, over_ar, methods, static)]

    def ratio(a: str, b: str) -> tuple[float, float, float]:
        ci = speedup_interval(units, a, b)
        return units.rate(a) / units.rate(b), float(ci.lo), float(ci.hi)

    verdicts = [f"## Registered goals ({language} only; each is registered for English and Italian)", ""]
    for phase, view in views.items():
        lo, hi = over_ar[phase][CONTROLLER]
        rate = view.rate
        verdicts.append(f"- Goal 1, {phase}: controller over AR {_ratio(rate[CONTROLLER] / rate[AR], lo, hi)}; "
                        f"lower bound ≥ {NON_INFERIOR}: **{'met' if lo >= NON_INFERIOR else 'not met'}**")
    gain, glo, ghi = ratio(CONTROLLER, static) if static != CONTROLLER else (1.0, 1.0, 1.0)
    met2 = gain >= 1 + GAIN and glo > 1
    verdicts.append(f"- Goal 2: controller over `{static}` {100 * (gain - 1):+.1f}% {_pct(glo, ghi)}; ≥ +10% with the "
                    f"interval above 0: **{'met' if met2 else 'not met'}**")
    if MAP in methods:
        mp, mlo, mhi = ratio(CONTROLLER, MAP)
        if answers["map_vs_static_pct"] >= PILOT_CUT:
            verdicts.append(f"- Goal 3 (pilot {answers['map_vs_static_pct']:+.1f}% ≥ +{PILOT_CUT:g}%: non-inferior to "
                            f"the map): controller over the map {_ratio(mp, mlo, mhi)}; lower bound ≥ {NON_INFERIOR}: "
                            f"**{'met' if mlo >= NON_INFERIOR else 'not met'}**")
        else:
            map_gain = ratio(MAP, static)[0] - 1 if static != MAP else 0.0
            share = (gain - 1) / map_gain if map_gain > 0 else float("nan")
            met3 = map_gain > 0 and gain - 1 >= SHARE * map_gain and glo > 1
            verdicts.append(f"- Goal 3 (pilot {answers['map_vs_static_pct']:+.1f}% < +{PILOT_CUT:g}%: ≥ 80% of the "
                            f"map's gain): the map over `{static}` {100 * map_gain:+.1f}%, the controller's share "
                            f"{share:.0%} (controller over the map {_ratio(mp, mlo, mhi)}): "
                            f"**{'met' if met3 else 'not met'}**")
    if RULE in methods:
        greedy_alone = views["greedy-c1"]
        rate = greedy_alone.rate
        lo, hi = greedy_alone.over(RULE)[CONTROLLER]
        verdicts.append(f"- Goal 4, greedy-c1: controller over `{RULE}` {_ratio(rate[CONTROLLER] / rate[RULE], lo, hi)}"
                        f"; lower bound ≥ {NON_INFERIOR}: **{'met' if lo >= NON_INFERIOR else 'not met'}**")
    if PPO in methods:
        pp, plo, phi = ratio(PPO, CONTROLLER)
        verdicts.append(f"- PPO (reported, no goal): over the controller on the whole workload {_ratio(pp, plo, phi)}")
    return "\n".join(out + verdicts) + "\n"


LANGUAGES = {"en": "English", "it": "Italian"}


def judge_folder(folder: Path) -> str:
    """:func:`judge` on each of a results folder's held-out runs and the map beside it (the language from the run's
    name: ``held-out-<code>``), one after another in the order of their codes."""
    runs = sorted(folder.glob("held-out-*"))
    if not runs:
        raise SystemExit(f"{folder} holds no held-out-<language> run")
    codes = [run.name.removeprefix("held-out-") for run in runs]
    return "\n".join(judge(run, folder / f"map-{code}.json", LANGUAGES.get(code, code))
                     for run, code in zip(runs, codes, strict=True))


def main(folder: Path, argv: list[str] | None = None) -> None:
    """A results folder's ``judge.py``: print the readings, and with ``--write`` also write its TABLES.md."""
    parser = argparse.ArgumentParser(description=f"The registered readings of {folder.name}")
    parser.add_argument("--write", action="store_true", help="also write TABLES.md beside the runs")
    text = judge_folder(folder)
    if parser.parse_args(argv).write:
        (folder / "TABLES.md").write_text(text)
    print(text)
