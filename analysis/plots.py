"""Figures of a run or sweep, one message each, from the tidy frames of :mod:`analysis.load`.

Every function returns a matplotlib ``Figure`` (the Figure API: no pyplot state, works under Agg and in
notebooks) or ``None`` when its data is absent, so a report or notebook can say what it skipped.
Axes carry units. Speed-ups are TPOT-based (decode only, like the cost model) with 95% intervals from a
paired bootstrap over prompts (the AR and the method ran the same prompts in the same run).
"""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy import stats

from analysis.load import fixed_gamma
from spectune.methods import BASELINE, is_fixed_label

log = logging.getLogger(__name__)

N_RESAMPLES = 1000
SEED = 0


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes (what the report writes and a notebook shows)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def show(figure: Figure | None, absent: str = "_No data for this figure._") -> Any:
    """For a notebook cell: the figure as an inline PNG image, or a Markdown note saying why it is absent
    (Figure-API figures have no pyplot manager, so IPython would print only their repr)."""
    from IPython.display import Image, Markdown

    return Markdown(absent) if figure is None else Image(data=png(figure), format="png")


def _label(frame: pd.DataFrame) -> pd.Series:
    """A series label per row: the language, plus the concurrency when the frame holds several."""
    language = frame["language"].fillna(frame.get("workload", "?")).astype(str)
    if "concurrency" in frame and frame["concurrency"].nunique() > 1:
        return language + ", concurrency " + frame["concurrency"].astype(str)
    return language


def _mean_ratio(ar: np.ndarray, method: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(ar, axis=axis) / np.mean(method, axis=axis)


def speedup_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per (run, method ≠ AR): TPOT-based speed-up (mean AR TPOT / mean TPOT over the prompts both completed)
    with a 95% percentile interval from a paired bootstrap over prompts (``N_RESAMPLES``, seed ``SEED``)."""
    ok = requests[(requests["status"] == "ok") & requests["tpot_ms"].notna()]
    pair_keys = [k for k in ("repeat", "prompt_id") if k in ok]
    rows = []
    for run, part in ok.groupby("run", sort=False):
        ar = part[part["method"] == BASELINE].groupby(pair_keys)["tpot_ms"].mean()
        for method, rows_m in part[part["method"] != BASELINE].groupby("method", sort=False):
            both = pd.concat([ar.rename("base"), rows_m.groupby(pair_keys)["tpot_ms"].mean().rename("m")],
                             axis=1).dropna()
            if both.empty:
                continue
            first, ar_tpot, m_tpot = rows_m.iloc[0], both["base"].to_numpy(), both["m"].to_numpy()
            row: dict[str, Any] = {"run": run, "method": method, "gamma": int(first["gamma"]),
                                   "language": first.get("language"), "concurrency": first.get("concurrency"),
                                   "n_prompts": len(both), "tpot_speedup": float(_mean_ratio(ar_tpot, m_tpot)),
                                   "ci95_lo": np.nan, "ci95_hi": np.nan}
            if len(both) > 1:
                ci = stats.bootstrap((ar_tpot, m_tpot), _mean_ratio, paired=True,
                                     vectorized=True, n_resamples=N_RESAMPLES, method="percentile",
                                     rng=np.random.default_rng(SEED)).confidence_interval
                row.update(ci95_lo=float(ci.low), ci95_hi=float(ci.high))
            rows.append(row)
    return pd.DataFrame(rows)


def speedup_vs_gamma(table: pd.DataFrame) -> Figure | None:
    """Fixed-γ speed-up against γ, one line per language (and concurrency), with 95% intervals."""
    fixed = table[fixed_gamma(table["method"])] if len(table) else table
    if fixed.empty:
        return None
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for label, part in fixed.assign(label=_label(fixed)).groupby("label"):
        part = part.groupby("gamma")[["tpot_speedup", "ci95_lo", "ci95_hi"]].mean().sort_index()
        err = np.vstack([part["tpot_speedup"] - part["ci95_lo"], part["ci95_hi"] - part["tpot_speedup"]])
        ax.errorbar(part.index, part["tpot_speedup"], yerr=np.nan_to_num(err), marker="o", capsize=3, label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft length γ (drafts per cycle)")
    ax.set_ylabel("speed-up over AR (× , mean TPOT ratio)")
    ax.set_title("Which γ pays: TPOT-based speed-up (95% paired bootstrap over prompts)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def latency_distribution(requests: pd.DataFrame, metric: str) -> Figure | None:
    """Box plots of one per-request latency (``ttft_ms`` or ``tpot_ms``) per method and series."""
    ok = requests[(requests["status"] == "ok") & requests[metric].notna()] if len(requests) else requests
    if ok.empty:
        return None
    ok = ok.assign(label=_label(ok))
    groups = [(f"{m}\n{lab}", part[metric].to_numpy()) for (lab, m), part in ok.groupby(["label", "method"])]
    fig = Figure(figsize=(max(6, 0.9 * len(groups)), 4.5))
    ax = fig.add_subplot()
    ax.boxplot([g[1] for g in groups], tick_labels=[g[0] for g in groups], showfliers=True)
    name = {"ttft_ms": "TTFT", "tpot_ms": "TPOT"}.get(metric, metric)
    ax.set_ylabel(f"{name} per request (ms)")
    ax.set_title(f"{name} distribution per method ({len(ok)} requests)")
    ax.tick_params(axis="x", labelsize=7, rotation=45)
    ax.grid(alpha=0.3, axis="y")
    return fig


def _spec_cycles(cycles: pd.DataFrame) -> pd.DataFrame:
    return cycles[cycles["num_drafts"] > 0] if len(cycles) else cycles


def accepted_length_histogram(cycles: pd.DataFrame) -> Figure | None:
    """Share of cycles that accepted k drafts, per γ, one panel per language: where the mass sits."""
    spec = _spec_cycles(cycles)
    spec = spec[fixed_gamma(spec["method"])] if len(spec) else spec
    if spec.empty:
        return None
    languages = sorted(spec["language"].dropna().unique()) if "language" in spec else ["?"]
    fig = Figure(figsize=(5 * len(languages), 4))
    for i, language in enumerate(languages):
        ax = fig.add_subplot(1, len(languages), i + 1)
        part = spec[spec["language"] == language] if "language" in spec else spec
        gammas = sorted(part["gamma"].unique())
        width = 0.8 / len(gammas)
        for j, gamma in enumerate(gammas):
            counts = part.loc[part["gamma"] == gamma, "accepted"].value_counts(normalize=True).sort_index()
            ax.bar(counts.index + (j - (len(gammas) - 1) / 2) * width, counts.to_numpy(), width, label=f"γ={gamma}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("drafts accepted in a cycle")
        ax.set_ylabel("share of cycles")
        ax.set_title(f"Accepted length, {language}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    return fig


def per_position_acceptance(cycles: pd.DataFrame) -> pd.DataFrame:
    """P(first i drafts accepted | at least i drafted), per language and position i (all γ pooled)."""
    spec = _spec_cycles(cycles)
    rows = []
    for language, part in (spec.groupby("language") if len(spec) else []):
        for i in range(1, int(part["num_drafts"].max()) + 1):
            drafted = part[part["num_drafts"] >= i]
            rows.append({"language": language, "position": i, "cycles": len(drafted),
                         "joint_acceptance": float((drafted["accepted"] >= i).mean())})
    return pd.DataFrame(rows)


def per_position_figure(table: pd.DataFrame) -> Figure | None:
    """Joint acceptance against draft position per language, next to α^i with α from position 1."""
    if table.empty:
        return None
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for language, part in table.groupby("language"):
        line, = ax.plot(part["position"], part["joint_acceptance"], marker="o", label=f"{language} measured")
        alpha = float(part["joint_acceptance"].iloc[0])
        ax.plot(part["position"], alpha ** part["position"], linestyle=":", color=line.get_color(),
                label=f"{language} α^i, α={alpha:.2f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(first i drafts accepted)")
    ax.set_ylim(0, 1)
    ax.set_title("Per-position acceptance: does it decay like α^i?")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def vs_concurrency(summaries: pd.DataFrame, field: str, ylabel: str, title: str) -> Figure | None:
    """One recorded summary field against concurrency, one line per method (and language)."""
    ok = summaries[summaries["status"] == "ok"] if len(summaries) else summaries
    if ok.empty or "concurrency" not in ok or ok["concurrency"].nunique() < 2 or field not in ok:
        return None
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    series = ok["method"] + (", " + ok["language"].astype(str) if ok["language"].nunique() > 1 else "")
    for label, part in ok.assign(series=series).groupby("series"):
        part = part.groupby("concurrency")[field].mean().sort_index()
        ax.plot(part.index, part.to_numpy(), marker="o", label=label)
    ax.set_xscale("log", base=2)
    levels = sorted(ok["concurrency"].unique())
    ax.set_xticks(levels, [str(v) for v in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def costmodel_figure(fit: pd.DataFrame) -> Figure | None:
    """The fitted cost model's speed-up, the constant-α one and the measurement against γ."""
    if fit.empty:
        return None
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for batch, part in fit.groupby("batch_size"):
        part = part.groupby("gamma")[["predicted_speedup", "constant_alpha_speedup", "measured_speedup"]].mean()
        line, = ax.plot(part.index, part["measured_speedup"], marker="o", label=f"measured, batch {batch}")
        ax.plot(part.index, part["predicted_speedup"], marker="x", linestyle="--", color=line.get_color(),
                label=f"fitted (joint acceptance), batch {batch}")
        ax.plot(part.index, part["constant_alpha_speedup"], linestyle=":", color=line.get_color(),
                label=f"constant α, batch {batch}")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft length γ")
    ax.set_ylabel("TPOT-based speed-up over AR (×)")
    ax.set_title("Cost model against the measurement")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def policies_vs_grid(table: pd.DataFrame) -> Figure | None:
    """Every method's speed-up as a bar, adaptive policies beside the fixed-γ grid (best fixed γ dashed)."""
    if table.empty or not (~fixed_gamma(table["method"])).any():
        return None
    table = table.assign(label=_label(table))
    panels = sorted(table["label"].unique())
    fig = Figure(figsize=(max(6, 0.6 * table["method"].nunique()) * len(panels), 4.5))
    for i, label in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        part = table[table["label"] == label].groupby("method", sort=False)["tpot_speedup"].mean()
        colors = ["tab:blue" if is_fixed_label(m) else "tab:orange" for m in part.index]
        ax.bar(range(len(part)), part.to_numpy(), color=colors)
        fixed = part[[is_fixed_label(m) for m in part.index]]
        if len(fixed):
            ax.axhline(float(fixed.max()), color="tab:blue", linestyle="--", linewidth=0.8, label="best fixed γ")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(part)), part.index, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("TPOT-based speed-up over AR (×)")
        ax.set_title(f"Policies (orange) vs the fixed-γ grid, {label}")
        ax.grid(alpha=0.3, axis="y")
    return fig
