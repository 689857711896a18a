"""Print this page's tables from the committed run directories:
python bench/results/verify-width-smollm2-cpu-20261206/tables.py

``profile-en/``: task=profile, the verification's mean cost per width n (the AR step is n = 1) and the widths the
profile names as dearer than a longer one; ``gamma-en/`` and ``feature-en/``: task=bench, the independent draft and
the feature draft at γ 2 and γ 4 against AR, greedy, per task; ``profile-en-default/`` and ``profile-en-cbwr/``: the
profile again, without and with ``MKL_CBWR=AVX512``; ``feature-en-cbwr/``: the feature draft's run under that variable;
then the registered readings."""

from __future__ import annotations

from pathlib import Path

from analysis.timed_vs_predicted import measured, sampled_table
from spectune.costmodel.profile import Profile, dearer_than_longer
from spectune.run import rundir

HERE = Path(__file__).resolve().parent
GAMMAS = (2, 4)
RUNS = {"gamma-en": "the independent draft (models=smollm2)", "feature-en": "the feature draft (models=smollm2-eagle)",
        "feature-en-cbwr": "the feature draft (models=smollm2-eagle) under MKL_CBWR=AVX512"}


def verify_seconds(run: str) -> list[float]:
    """The profile's mean verification seconds at batch 1, n = 1..max_positions."""
    return [float(t) for t in Profile.from_json(rundir.PROFILE.read(HERE / run), run).verify_times(1)]


def cbwr_table() -> tuple[list[str], list[float], list[float]]:
    default, cbwr = verify_seconds("profile-en-default"), verify_seconds("profile-en-cbwr")
    lines = ["\n### en: verification cost per width without and with MKL_CBWR=AVX512 (batch 1, back to back)\n",
             "| n (γ + 1) | default ms | AR steps | MKL_CBWR=AVX512 ms | AR steps |", "| --- " * 5 + "|"]
    for n, (d, c) in enumerate(zip(default, cbwr, strict=True), start=1):
        lines.append(f"| {n} | {d * 1e3:.1f} | {d / default[0]:.2f} | {c * 1e3:.1f} | {c / cbwr[0]:.2f} |")
    return lines, default, cbwr


def profile_table() -> tuple[list[str], list[tuple[int, int]]]:
    seconds = verify_seconds("profile-en")
    dearer = dearer_than_longer(seconds)
    named = {n: m for n, m in dearer}
    lines = ["\n### en: verification cost per width (batch 1, mean of 10 cycles)\n",
             "| n (γ + 1) | ms | AR steps | dearer than |", "| --- " * 4 + "|"]
    for n, t in enumerate(seconds, start=1):
        lines.append(f"| {n} | {t * 1e3:.1f} | {t / seconds[0]:.2f} | {f'n={named[n]}' if n in named else '-'} |")
    return lines, dearer


def main() -> None:
    lines, dearer = profile_table()
    print("\n".join(lines))
    cbwr_lines, default, cbwr = cbwr_table()
    print("\n".join(cbwr_lines))
    overall: dict[str, dict[int, dict]] = {}  # run -> γ -> its "all" row of by_category
    for run, label in RUNS.items():
        overall[run] = {}
        for gamma in GAMMAS:
            print("\n".join(sampled_table("en", HERE / run, gamma, f"en: {label}, γ {gamma}, greedy", same_as_ar=True)))
            overall[run][gamma] = measured(HERE / run, f"fixed:gamma={gamma}")[0]["all"]
    speedup = {run: {g: row["decode_speedup"] for g, row in rows.items()} for run, rows in overall.items()}
    named = {n for n, _ in dearer}
    own, feature = speedup["gamma-en"], speedup["feature-en"]
    print("\n### Readings (registered in REGISTERED.md)\n")
    print(f"1. the profile names n = 2 and n = 3 as dearer than a longer width: "
          f"{'pass' if {2, 3} <= named else 'fail'} (named: {sorted(named)})")
    print(f"2. independent draft: γ 4's decode speed-up ≥ 1.15 × γ 2's: {own[4]:.3f} / {own[2]:.3f} = "
          f"{own[4] / own[2]:.3f}: {'pass' if own[4] / own[2] >= 1.15 else 'fail'}")
    print(f"3. independent draft: both below AR: γ 2 {own[2]:.3f}, γ 4 {own[4]:.3f}: "
          f"{'pass' if max(own.values()) < 1.0 else 'fail'}")
    print(f"4. feature draft: γ 4's decode speed-up ≥ 1.10 × γ 2's: {feature[4]:.3f} / {feature[2]:.3f} = "
          f"{feature[4] / feature[2]:.3f}: {'pass' if feature[4] / feature[2] >= 1.10 else 'fail'}")
    print(f"5. feature draft: γ 4 below AR: {feature[4]:.3f}: {'pass' if feature[4] < 1.0 else 'fail'}")
    dear = [n for n, _ in dearer_than_longer(cbwr) if 2 <= n <= 9]
    print(f"6. with MKL_CBWR=AVX512 no width 2–9 is dearer than a longer one: {'pass' if not dear else 'fail'} "
          f"(named: {dear})")
    print(f"7. with it, 3 positions ≤ 1.4 AR steps: {cbwr[2] / cbwr[0]:.2f}: "
          f"{'pass' if cbwr[2] / cbwr[0] <= 1.4 else 'fail'}")
    change = cbwr[0] / default[0] - 1
    print(f"8. the AR step changes by less than 10%: {default[0] * 1e3:.1f} → {cbwr[0] * 1e3:.1f} ms ({change:+.0%}): "
          f"{'pass' if abs(change) < 0.10 else 'fail'}")
    under = speedup["feature-en-cbwr"]
    lows = {g: row["decode_speedup_ci95_lo"] for g, row in overall["feature-en-cbwr"].items()}
    print(f"9. under MKL_CBWR=AVX512 the feature draft's γ 4 decode speed-up ≥ 0.85× AR: {under[4]:.3f}: "
          f"{'pass' if under[4] >= 0.85 else 'fail'}")
    print(f"10. no decode speed-up's 95% interval wholly above 1.0: lower bounds γ 2 {lows[2]:.3f}, γ 4 {lows[4]:.3f}: "
          f"{'pass' if max(lows.values()) <= 1.0 else 'fail'}")

if __name__ == "__main__":
    main()
