"""Print this page's tables from the committed run directories:
python bench/results/verify-width-smollm2-cpu-20261206/tables.py

``profile-en/``: task=profile, the verification's mean cost per width n (the AR step is n = 1) and the widths the
profile names as dearer than a longer one; ``gamma-en/``: task=bench, the independent draft at γ 2 and γ 4 against
AR, greedy, per task; then the registered readings."""

from __future__ import annotations

from pathlib import Path

from analysis.timed_vs_predicted import measured, sampled_table
from spectune import rundir
from spectune.profile import Profile, dearer_than_longer

HERE = Path(__file__).resolve().parent
GAMMAS = (2, 4)


def profile_table() -> tuple[list[str], list[tuple[int, int]]]:
    profile = Profile.from_json(rundir.PROFILE.read(HERE / "profile-en"), "profile-en")
    seconds = [float(t) for t in profile.verify_times(1)]
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
    speedup = {}
    for gamma in GAMMAS:
        print("\n".join(sampled_table("en", HERE / "gamma-en", gamma, f"en: the independent draft, γ {gamma}, greedy",
                                      same_as_ar=True)))
        speedup[gamma] = measured(HERE / "gamma-en", f"fixed:gamma={gamma}")[0]["all"]["decode_speedup"]
    ratio = speedup[4] / speedup[2]
    named = {n for n, _ in dearer}
    print("\n### Readings (registered in REGISTERED.md)\n")
    print(f"1. the profile names n = 2 and n = 3 as dearer than a longer width: "
          f"{'pass' if {2, 3} <= named else 'fail'} (named: {sorted(named)})")
    print(f"2. γ 4's decode speed-up ≥ 1.15 × γ 2's: {speedup[4]:.3f} / {speedup[2]:.3f} = {ratio:.3f}: "
          f"{'pass' if ratio >= 1.15 else 'fail'}")
    print(f"3. both below AR: γ 2 {speedup[2]:.3f}, γ 4 {speedup[4]:.3f}: "
          f"{'pass' if max(speedup.values()) < 1.0 else 'fail'}")


if __name__ == "__main__":
    main()
