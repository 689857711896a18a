"""Print this page's tables from the committed run directories:
python bench/results/suffix-prediction-smollm2-cpu-20261205/tables.py

Suffix decoding: ``predict-LANG/prediction.json`` (priced with ``profile-en/profile.json``, verification of 1..25
positions). Prompt lookup beside it: the registered replay (``../lookup-prediction-smollm2-cpu-20261205/
predict-LANG/prediction.parquet``) re-priced with the same deeper profile, so both drafts meet one profile."""

from __future__ import annotations

from pathlib import Path

from analysis.timed_vs_predicted import ROWS
from spectune.costmodel.profile import load_profile
from spectune.measure.prediction import by_category, price
from spectune.run import rundir

HERE = Path(__file__).resolve().parent
LOOKUP = HERE.parent / "lookup-prediction-smollm2-cpu-20261205"


def lookup_repriced(lang: str) -> dict[tuple[int, str], dict]:
    """Prompt lookup's registered replay, priced with this page's profile (each row's own search seconds)."""
    costs = load_profile(rundir.PROFILE.path(HERE / "profile-en")).costs(1)
    frame = price(rundir.PREDICTION.read(LOOKUP / f"predict-{lang}"), costs)
    return {(int(r["gamma"]), r["category"]): r for r in by_category(frame).to_dict("records")}


def main() -> None:
    for lang in ("en", "it"):
        data = rundir.PREDICTION_SUMMARY.read(HERE / f"predict-{lang}")
        rows = {(r["gamma"], r["category"]): r for r in data["by_category"]}
        gammas = data["gammas"]
        best = max(gammas, key=lambda g: rows[(g, "all")]["predicted_speedup"])
        lookup = lookup_repriced(lang)
        lookup_gammas = sorted({g for g, _ in lookup})
        lookup_best = max(lookup_gammas, key=lambda g: lookup[(g, "all")]["predicted_speedup"])
        print(f"\n### {lang}: suffix decoding γ* = {best}; prompt lookup re-priced γ* = {lookup_best}\n")
        print("| category | copyable fraction | suffix no-proposal share at γ* | suffix acceptance length at γ* | "
              + " | ".join(f"suffix γ={g}" for g in gammas)
              + f" | lookup γ*={lookup_best} (re-priced) | lookup acceptance length |")
        print("| --- " * (4 + len(gammas) + 2) + "|")
        for category in ROWS:
            at = rows[(best, category)]
            cells = [category, f"{at['copyable_fraction']:.2f}", f"{at['no_proposal_share']:.2f}",
                     f"{at['acceptance_length']:.2f}"]
            cells += [f"{rows[(g, category)]['predicted_speedup']:.2f}×" for g in gammas]
            cells += [f"{lookup[(lookup_best, category)]['predicted_speedup']:.2f}×",
                      f"{lookup[(lookup_best, category)]['acceptance_length']:.2f}"]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
