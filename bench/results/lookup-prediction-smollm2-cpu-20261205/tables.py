"""Print this page's tables from the committed prediction.json files:
python bench/results/lookup-prediction-smollm2-cpu-20261205/tables.py"""

from __future__ import annotations

from pathlib import Path

from analysis.timed_vs_predicted import ROWS
from spectune.run import rundir

HERE = Path(__file__).resolve().parent


def main() -> None:
    for lang in ("en", "it"):
        data = rundir.PREDICTION_SUMMARY.read(HERE / f"predict-{lang}")
        rows = {(r["gamma"], r["category"]): r for r in data["by_category"]}
        gammas = data["gammas"]
        best = max(gammas, key=lambda g: rows[(g, "all")]["predicted_speedup"])
        print(f"\n### {lang}: γ* = {best} (highest predicted overall speed-up)\n")
        print("| category | requests | output tokens | copyable fraction | no-proposal share at γ* "
              "| acceptance length at γ* | " + " | ".join(f"predicted γ={g}" for g in gammas) + " |")
        print("| --- " * (6 + len(gammas)) + "|")
        for category in ROWS:
            at = rows[(best, category)]
            cells = [category, str(at["requests"]), f"{at['output_tokens']:,}", f"{at['copyable_fraction']:.2f}",
                     f"{at['no_proposal_share']:.2f}", f"{at['acceptance_length']:.2f}"]
            cells += [f"{rows[(g, category)]['predicted_speedup']:.2f}×" for g in gammas]
            print("| " + " | ".join(cells) + " |")
        print("\nWhat the target wrote (AR, greedy):\n")
        print("| category | stop | length | in expected language | repetition p50 | output tokens p50 |")
        print("| --- | --- | --- | --- | --- | --- |")
        for a in data["answers_by_category"]:
            print(f"| {a['category']} | {a['stop']:.2f} | {a['length']:.2f} | {a['in_expected_language']:.2f} | "
                  f"{a['repetition_p50']:.2f} | {a['output_tokens_p50']:.0f} |")


if __name__ == "__main__":
    main()
