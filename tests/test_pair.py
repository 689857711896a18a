"""``python -m analysis.comparison RUNS --pair A B``: any two methods of a run against each other on decode tok/s,
paired over prompts (each prompt's repeats together), read from the committed tiny sweep (a real run of the CLI)."""

from __future__ import annotations

import pytest

from analysis.comparison import main, paired_decode
from spectune.errors import SpectuneError
from spectune.run import rundir
from spectune.stats.compare import decode_units


def test_a_pair_is_the_ratio_of_pooled_decode_rates_on_shared_clusters(tiny_sweep):
    """One row per job (concurrency 1 and 2); the estimate is Σ tokens after the first / Σ decode time of A over
    B's on the units both completed (computed here from requests.parquet: prompts at concurrency 1, pairs of
    consecutive prompts at concurrency 2); a method against itself is 0%."""
    table = paired_decode(tiny_sweep, "fixed:gamma=1", "ar")
    assert sorted(table["concurrency"]) == [1, 2]
    for _, row in table.iterrows():
        requests = rundir.REQUESTS.read(row["run"])
        units = decode_units(requests[requests["method"].isin(["fixed:gamma=1", "ar"])], row["concurrency"])
        rate = {m: units.num[m].sum() / units.den[m].sum() for m in ("fixed:gamma=1", "ar")}
        assert row["units"] == units.n > 1 and row["unit"] == units.unit
        assert row["verdict"] and row["mde_pct"] > 0
        assert row["a_vs_b_pct"] == pytest.approx(100 * (rate["fixed:gamma=1"] / rate["ar"] - 1), rel=1e-9)
        assert row["ci95_lo"] <= row["a_vs_b_pct"] <= row["ci95_hi"]
    same = paired_decode(tiny_sweep, "ar", "ar")
    assert (same["a_vs_b_pct"].abs() < 1e-9).all()


def test_a_bad_pair_fails_in_one_line(tiny_sweep, tmp_path, capsys):
    with pytest.raises(SpectuneError, match=r"--pair method 'ppo' is not in .*: its methods are ar, fixed:gamma=1"):
        paired_decode(tiny_sweep, "ppo", "ar")
    with pytest.raises(SpectuneError, match=r"no requests\.parquet"):
        paired_decode(tmp_path, "ar", "ar")
    for argv, bad in (([str(tiny_sweep), "--pair", "ppo", "ar"], "'ppo'"),
                      ([str(tiny_sweep), "--pair", "ar", "ar", "--metric", "e2e"], "--metric=e2e")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert bad in err and "\n" not in err
    assert main([str(tiny_sweep), "--pair", "fixed:gamma=2", "ar"]) == 0
