"""Print this page's tables and the registered readings' verdicts from the committed run directories:
python bench/results/lookup-timed-smollm2-cpu-20261205/judge.py

Measured: ``greedy-LANG/`` and ``t1-LANG/`` (task=bench, AR and prompt lookup at γ = 8); predicted:
``../lookup-prediction-smollm2-cpu-20261205/predict-LANG/prediction.json`` (registered at c3b5515). The readings
are REGISTERED.md's, fixed before the runs (analysis.timed_vs_predicted.Readings' defaults)."""

from __future__ import annotations

from pathlib import Path

from analysis.timed_vs_predicted import greedy_table, sampled_table

HERE = Path(__file__).resolve().parent
PREDICTED = HERE.parent / "lookup-prediction-smollm2-cpu-20261205"
GAMMA = 8


def main() -> None:
    for lang in ("en", "it"):
        print("\n".join(greedy_table(lang, HERE / f"greedy-{lang}", PREDICTED / f"predict-{lang}", GAMMA, "lookup",
                                     "3 repeats")))
    for lang in ("en", "it"):
        if (HERE / f"t1-{lang}").exists():
            print("\n".join(sampled_table(lang, HERE / f"t1-{lang}", GAMMA)))


if __name__ == "__main__":
    main()
