"""Print this page's tables and the registered readings' verdicts from the committed run directories:
python bench/results/suffix-timed-smollm2-cpu-20261206/judge.py

Measured: ``greedy-LANG/`` and ``t1-LANG/`` (task=bench, AR and suffix decoding at γ* = 24, SuffixDecoding's rule;
T = 1 reported, not judged); predicted:
``../suffix-prediction-smollm2-cpu-20261205/predict-LANG/prediction.json`` (registered at f105cbf, with the readings,
analysis.timed_vs_predicted.Readings' defaults). Reading 4, suffix against prompt lookup, sets each draft's measured
speed-up over its own run's AR side by side (``../lookup-timed-smollm2-cpu-20261205/greedy-LANG``, γ = 8); the same
for the T = 1 runs (``t1-LANG``)."""

from __future__ import annotations

from pathlib import Path

from analysis.timed_vs_predicted import ROWS, greedy_table, measured, sampled_table

HERE = Path(__file__).resolve().parent
PREDICTED = HERE.parent / "suffix-prediction-smollm2-cpu-20261205"
LOOKUP = HERE.parent / "lookup-timed-smollm2-cpu-20261205"
GAMMA, LOOKUP_GAMMA = 24, 8


def against_lookup(lang: str, mode: str = "greedy") -> list[str]:
    """Suffix decoding's and prompt lookup's measured speed-ups side by side (``mode``: greedy or t1 runs)."""
    suffix, _, _ = measured(HERE / f"{mode}-{lang}", f"fixed:gamma={GAMMA}")
    lookup, _, _ = measured(LOOKUP / f"{mode}-{lang}", f"fixed:gamma={LOOKUP_GAMMA}")
    what = "reading 4" if mode == "greedy" else "T = 1"
    lines = [f"\n### {lang}: suffix decoding against prompt lookup ({what}, reported, not judged)\n",
             "| category | acceptance length suffix / lookup | decode speed-up over AR, suffix [95% CI] | "
             "lookup [95% CI] | suffix / lookup |", "| --- " * 5 + "|"]
    for category in ROWS:
        s, k = suffix[category], lookup[category]
        lines.append(f"| {category} | {s['acceptance_length']:.2f} / {k['acceptance_length']:.2f} | "
                     f"{s['decode_speedup']:.2f}× [{s['decode_speedup_ci95_lo']:.2f}, "
                     f"{s['decode_speedup_ci95_hi']:.2f}] | {k['decode_speedup']:.2f}× "
                     f"[{k['decode_speedup_ci95_lo']:.2f}, "
                     f"{k['decode_speedup_ci95_hi']:.2f}] | {s['decode_speedup'] / k['decode_speedup']:.3f} |")
    return lines


def main() -> None:
    for lang in ("en", "it"):
        if (HERE / f"greedy-{lang}").exists():
            print("\n".join(greedy_table(lang, HERE / f"greedy-{lang}", PREDICTED / f"predict-{lang}", GAMMA,
                                         "suffix", "1 repeat")))
            print("\n".join(against_lookup(lang)))
    for lang in ("en", "it"):
        if (HERE / f"t1-{lang}").exists():
            print("\n".join(sampled_table(lang, HERE / f"t1-{lang}", GAMMA)))
            print("\n".join(against_lookup(lang, "t1")))


if __name__ == "__main__":
    main()
