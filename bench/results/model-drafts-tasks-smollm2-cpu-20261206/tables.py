"""Print this page's tables from the committed run directories (reported, not judged):
python bench/results/model-drafts-tasks-smollm2-cpu-20261206/tables.py

``MODELS-LANG/``: task=bench, AR and the draft model at γ = 2, greedy, one repeat. Per task: tokens per cycle,
acceptance length, the no-proposal share (0 for a draft model), decode and wall speed-up over AR with their 95%
intervals (prompt as the unit); then how many requests decoded exactly AR's output (greedy must)."""

from __future__ import annotations

from pathlib import Path

from analysis.timed_vs_predicted import sampled_table

HERE = Path(__file__).resolve().parent
GAMMA = 2
DRAFTS = {"smollm2-eagle": "the feature draft", "smollm2": "the independent draft"}


def main() -> None:
    for models, label in DRAFTS.items():
        for lang in ("en", "it"):
            run = HERE / f"{models}-{lang}"
            if not run.exists():
                continue
            print("\n".join(sampled_table(lang, run, GAMMA, f"{lang}: {label} (models={models}), γ {GAMMA}, greedy",
                                          same_as_ar=True)))


if __name__ == "__main__":
    main()
