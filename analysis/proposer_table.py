"""Every draft of smollm2 side by side, per category and language: which one to serve for which work.

    python -m analysis.proposer_table            # write the tables into docs/models.md (between their markers)
    python -m analysis.proposer_table --check    # exit 1 if the committed tables differ from what the runs give

One table per language from the committed timed runs (``task=bench``, greedy, float32, two threads, concurrency 1,
the held-out prompts of the built categories): for each category the copyable fraction of the target's greedy output
(tokens inside an n ≥ 3 match with the context, from prompt lookup's registered prediction) and, per draft, its
acceptance length (tokens per verified chain) and its decode speed-up over AR with the 95% interval (prompt as the
unit). Each draft at the γ it was timed at; a draft whose run is not committed reads "not timed".
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from analysis.results_index import splice
from analysis.timed_vs_predicted import ROWS
from spectune.methods import Method
from spectune.run import rundir
from spectune.stats.by_category import ALL

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PAGE = REPO / "docs" / "models.md"
BEGIN = "<!-- proposer-table:begin (python -m analysis.proposer_table writes these tables) -->"
END = "<!-- proposer-table:end -->"
LANGUAGES = ("en", "it")
COPYABLE = "lookup-prediction-smollm2-cpu-20261205/predict-{lang}"


@dataclass(frozen=True)
class Draft:
    """One column: a draft's timed run (``{lang}`` in the path) and the γ it ran at."""

    label: str
    run: str
    gamma: int


DRAFTS = (
    Draft("feature draft", "model-drafts-tasks-smollm2-cpu-20261206/smollm2-eagle-{lang}", 2),
    Draft("independent draft", "model-drafts-tasks-smollm2-cpu-20261206/smollm2-{lang}", 2),
    Draft("prompt lookup", "lookup-timed-smollm2-cpu-20261205/greedy-{lang}", 8),
    Draft("suffix decoding", "suffix-timed-smollm2-cpu-20261206/greedy-{lang}", 24),
)


def _cell(row: dict | None) -> str:
    if row is None:
        return "not timed"
    return (f"{row['acceptance_length']:.2f} · {row['decode_speedup']:.2f}× "
            f"[{row['decode_speedup_ci95_lo']:.2f}, {row['decode_speedup_ci95_hi']:.2f}]")


def _rows(draft: Draft, lang: str, root: Path) -> tuple[dict[str, dict], int]:
    """The draft's by_category rows of one language by category, and its prompts (empty, 0 when not committed)."""
    run = root / draft.run.format(lang=lang)
    if not rundir.SUMMARY.exists(run):
        return {}, 0
    method = Method.fixed(draft.gamma).label
    rows = {r["category"]: r for r in rundir.SUMMARY.read(run)["by_category"] if r["method"] == method}
    return rows, int(rows["all"]["prompts"]) if "all" in rows else 0


def _span(values: list[float], fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def reading(root: Path = RESULTS) -> str:
    """What the tables say, every figure read from them: each model-free draft's overall speed-up per language,
    on how many (category, language) cells suffix decoding decodes faster than prompt lookup (point estimates), and
    the draft models' overall speed-ups and acceptance lengths."""
    rows = {(d.label, lang): _rows(d, lang, root)[0] for d in DRAFTS for lang in LANGUAGES}
    if not all(rows.values()):
        return "Not every draft is timed in every language: no reading across them."
    free = [d for d in DRAFTS if d.label in {"prompt lookup", "suffix decoding"}]
    models = [d for d in DRAFTS if d not in free]
    each = "; ".join(f"{d.label} " + " and ".join(f"{rows[(d.label, lang)][ALL]['decode_speedup']:.2f}× ({lang})"
                                                  for lang in LANGUAGES) for d in free)
    cells = [(category, lang) for lang in LANGUAGES for category in ROWS if category != ALL]
    ahead = sum(rows[("suffix decoding", lang)][category]["decode_speedup"]
                > rows[("prompt lookup", lang)][category]["decode_speedup"] for category, lang in cells)
    speed = [rows[(d.label, lang)][ALL]["decode_speedup"] for d in models for lang in LANGUAGES]
    length = [rows[(d.label, lang)][ALL]["acceptance_length"] for d in models for lang in LANGUAGES]
    return (f"Read from the tables: over all categories {each} AR; suffix decoding is ahead of prompt lookup on "
            f"{ahead} of {len(cells)} (category, language) cells (point estimates); the draft models decode at "
            f"{_span(speed, '.2f')}× AR, with {_span(length, '.2f')} tokens a verified chain.")


def tables(root: Path = RESULTS) -> str:
    """The markdown of every language's table, then what they say."""
    out = []
    for lang in LANGUAGES:
        copyable = {r["category"]: r["copyable_fraction"]
                    for r in rundir.PREDICTION_SUMMARY.read(root / COPYABLE.format(lang=lang))["by_category"]}
        columns = [(d, *_rows(d, lang, root)) for d in DRAFTS]
        head = " | ".join(f"{d.label} (γ {d.gamma}, {n} prompts)" if n else d.label for d, _, n in columns)
        out += [f"**{lang}**", "", f"| category | copyable fraction | {head} |", "| --- " * (2 + len(DRAFTS)) + "|"]
        for category in ROWS:
            cells = " | ".join(_cell(rows.get(category)) if rows else "not timed" for _, rows, _ in columns)
            out.append(f"| {category} | {copyable[category]:.2f} | {cells} |")
        out.append("")
    runs = ", ".join(sorted({d.run.split("/")[0] for d in DRAFTS if (root / d.run.split("/")[0]).is_dir()}))
    out.append(f"Cells: acceptance length · decode speed-up over AR [95% CI]. Runs: {runs} (bench/results/).")
    out += ["", reading(root)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.proposer_table", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/models.md's tables are stale")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    text = PAGE.read_text(encoding="utf-8")
    new = splice(text, tables(), PAGE, BEGIN, END)
    if args.check:
        if new != text:
            logger.error("%s: the proposer tables differ from the committed runs; run python -m "
                         "analysis.proposer_table", PAGE.relative_to(REPO))
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    logger.info("wrote %s", PAGE.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
