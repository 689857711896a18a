"""`python -m analysis.report RUN_OR_SWEEP_DIR`: report.md and its PNGs, written into the directory.

The report is self-contained next to its figures: the run metadata, the printed tables (views of the tidy
frames), then one figure per message: speed-up against γ per language with intervals, TTFT and TPOT
distributions, accepted lengths and per-position acceptance per language, throughput and p99 TPOT
against concurrency, the cost model against the measurement, and policies against the fixed-γ grid.
A section whose data is absent says so and why, instead of failing.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import plots
from analysis.bench_table import bench_table, category_table
from analysis.load import add_speedups, find_runs, load_cycles, load_requests, load_summaries, swept
from spectune.errors import SpectuneError
from spectune.run import cli, rundir
from spectune.run.metadata import base_metadata
from spectune.stats.by_category import by_category, durations_of, several_categories

log = logging.getLogger(__name__)

REPORT = rundir.REPORT.name
METADATA_KEYS = ("models", "target", "draft", "dtype", "hardware", "device", "device_name", "execution_path",
                 "sampler", "temperature", "top_p", "top_k", "git_commit", "created_utc")


def markdown_table(frame: pd.DataFrame, floatfmt: str = "{:,.2f}") -> str:
    """A GitHub-flavoured Markdown table (index included), NaN shown as '-'."""
    frame = frame.reset_index() if frame.index.name or not isinstance(frame.index, pd.RangeIndex) else frame

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "-" if pd.isna(value) else floatfmt.format(value)
        return "-" if value is None else str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(str(c) for c in frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _optional(load: Callable[..., pd.DataFrame], path: Path, allow_mixed: bool) -> pd.DataFrame:
    """A table that some runs lack (all grid points failed): empty instead of an error."""
    try:
        return load(path, allow_mixed=allow_mixed)
    except SpectuneError as err:
        if "holds no spectune results" not in str(err):
            raise
        return pd.DataFrame()


def _cost_fits(path: Path) -> pd.DataFrame:
    runs = sorted(f.parent for f in path.rglob(rundir.COSTMODEL_FIT_CSV.name))
    return pd.concat([rundir.COSTMODEL_FIT_CSV.read(r) for r in runs], ignore_index=True) if runs else pd.DataFrame()


class Report:
    """Markdown sections and the figures beside them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.lines: list[str] = []
        self.figures: list[str] = []

    def section(self, title: str) -> None:
        self.lines += ["", f"## {title}", ""]

    def text(self, *lines: str) -> None:
        self.lines += list(lines)

    def figure(self, name: str, figure: Any, caption: str, absent: str) -> None:
        """Embed ``figure`` as ``name``.png, or say why it is absent."""
        if figure is None:
            self.text(f"_Skipped: {absent}_")
            return
        file = rundir.REPORT_FIGURE.named(name=name)
        file.write(self.directory, figure)
        self.figures.append(file.name)
        self.text(f"![{caption}]({file.name})", "", caption, "")

    def write(self) -> Path:
        text = "\n".join(self.lines).strip() + "\n"
        return rundir.REPORT.write(self.directory, text)


def build(path: Path | str, allow_mixed: bool = False) -> Path:
    """Write ``report.md`` and its PNGs into ``path`` (a run or a sweep directory); returns the report's path."""
    path = Path(path)
    summaries = add_speedups(load_summaries(path, allow_mixed))
    requests = _optional(load_requests, path, allow_mixed)
    cycles = _optional(load_cycles, path, allow_mixed)
    speedups = plots.speedup_table(requests) if len(requests) else pd.DataFrame()
    report = Report(path)
    runs = find_runs(path)
    report.text(f"# spectune report: {path}", "",
                f"{len(runs)} run(s), {len(summaries)} grid point(s); written {base_metadata()['created_utc']}.")

    report.section("Run metadata")
    first = summaries.iloc[0]
    meta = pd.DataFrame({"value": [first.get(k) for k in METADATA_KEYS]}, index=pd.Index(METADATA_KEYS, name="key"))
    report.text(markdown_table(meta), "")
    varied = swept(summaries)
    report.text(f"Swept: {', '.join(k.removeprefix('cfg.') for k in varied) if varied else 'nothing (one run)'}. "
                f"Workloads: {', '.join(sorted(summaries['workload'].dropna().astype(str).unique()))}.")

    report.section("Tables")
    for run, rows in summaries.groupby("run", sort=False):
        context = ", ".join(f"{k.removeprefix('cfg.')}={rows.iloc[0][k]}" for k in varied)
        report.text(f"**{run}** {context}", "", markdown_table(bench_table(rows.to_dict("records"))), "")
        summary = rundir.SUMMARY.read(run)
        for metric, rank in (summary.get("ranking") or {}).items():
            if isinstance(rank, dict) and rank.get("best"):
                report.text(f"Best by {metric}: **{rank['best']}**; indistinguishable from it (paired 95% CI of the "
                            f"difference contains 0): {', '.join(rank.get('indistinguishable') or []) or 'none'}; "
                            f"median − 1.4826·MAD pick: {rank.get('mad_pick')}.", "")
        per_category = _per_category(summary, requests, cycles, run)
        if per_category is not None:
            report.text("Per category (Spec-Bench style; tokens and seconds summed over repeats, the `all` row their "
                        "sums; speed-up paired vs ar over the category's prompts):", "",
                        markdown_table(category_table(per_category)), "")
    failed = summaries[summaries["status"] != "ok"]
    for row in failed.itertuples(index=False):
        report.text(f"- failed: {row.run} {row.method}: {getattr(row, 'error', '?')}")

    report.section("Speed-up against γ")
    n = int(speedups["n_prompts"].min()) if len(speedups) else 0
    report.figure("speedup_vs_gamma", plots.speedup_vs_gamma(speedups) if len(speedups) else None,
                  f"TPOT-based speed-up (mean AR TPOT / mean TPOT); bars: 95% percentile interval of a paired "
                  f"bootstrap over prompts (n ≥ {n} prompts, {plots.N_RESAMPLES} resamples, seed {plots.SEED}).",
                  "no fixed-γ runs with an AR baseline and per-request records.")

    report.section("Latency distributions")
    for metric, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        report.figure(name.lower(), plots.latency_distribution(requests, metric) if len(requests) else None,
                      f"{name} per request and method (box: quartiles, whiskers 1.5 IQR).",
                      f"no per-request records (requests.parquet) for {name}.")

    report.section("Acceptance")
    report.figure("accepted_length", plots.accepted_length_histogram(cycles) if len(cycles) else None,
                  "Share of cycles accepting k drafts, per γ and language (gpt-fast's accept_counts).",
                  "no speculative cycles (cycles.parquet) of fixed-γ runs.")
    positions = plots.per_position_acceptance(cycles) if len(cycles) else pd.DataFrame()
    report.figure("per_position_acceptance", plots.per_position_figure(positions),
                  "P(first i drafts accepted | i drafted), all γ pooled, against α^i with α from position 1.",
                  "no speculative cycles.")
    if len(positions):
        report.text("", markdown_table(positions, "{:.3f}"))

    report.section("Load: concurrency")
    absent = "one concurrency only: sweep it (-m concurrency=1,4,16) to see where a batch-one gain disappears."
    report.figure("throughput_vs_concurrency", plots.vs_concurrency(
        summaries, "output_throughput", "output throughput (tokens/s)", "Throughput against load"),
        "Output throughput per method against requests in flight.", absent)
    report.figure("p99_tpot_vs_concurrency", plots.vs_concurrency(
        summaries, "p99_tpot_ms", "p99 TPOT (ms)", "Tail latency against load"),
        "p99 TPOT per method against requests in flight.", absent)

    report.section("Cost model against the measurement")
    fits = _cost_fits(path)
    report.figure("costmodel_fit", plots.costmodel_figure(fits),
                  "Fitted cost model (joint acceptance from traces, costs from a profile) and the constant-α "
                  "model against the measured TPOT-based speed-up.",
                  "no costmodel_fit.csv here: run python -m analysis.costmodel --profile PROFILE.json "
                  f"--traces TRACES.parquet {path}")
    if len(fits):
        report.text("", markdown_table(fits[["gamma", "batch_size", "predicted_speedup", "measured_speedup",
                                             "error", "constant_alpha_speedup", "constant_alpha_error"]], "{:.3f}"))

    report.section("Policies against the fixed-γ grid")
    report.figure("policies_vs_grid", plots.policies_vs_grid(speedups) if len(speedups) else None,
                  "TPOT-based speed-up of every method; adaptive policies in orange, the best fixed γ dashed.",
                  "no adaptive policy in these runs (only fixed γ): run e.g. policy=confidence beside the grid.")
    out = report.write()
    log.info(f"wrote {out} and {len(report.figures)} figures")
    return out


def _per_category(summary: dict[str, Any], requests: pd.DataFrame, cycles: pd.DataFrame, run: str
                  ) -> list[dict[str, Any]] | pd.DataFrame | None:
    """A run's per-category rows: its summary's ``by_category``, else computed from its records when they hold
    several categories (a run written before the summary kept them); None for a run of one category."""
    if summary.get("by_category"):
        return summary["by_category"]
    mine = requests[requests["run"] == run] if len(requests) else requests
    if not len(mine) or not several_categories(mine):
        return None
    cyc = cycles[cycles["run"] == run] if len(cycles) else None
    unit_size = int((summary.get("statistics") or {}).get("unit_size") or 1)
    table = by_category(mine, cyc, durations_of(summary.get("points") or []), unit_size=unit_size)
    return table if len(table) else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="a run directory or a multirun (sweep) directory")
    parser.add_argument("--allow-mixed", action="store_true", help="allow runs of different models or hardware")
    return cli.run_command(parser, _build, argv)


def _build(args: argparse.Namespace) -> None:
    build(args.directory, args.allow_mixed)


if __name__ == "__main__":
    raise SystemExit(main())
