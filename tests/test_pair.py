"""``python -m analysis.comparison RUNS --pair A B``: any two methods of a run against each other on decode tok/s,
paired over (repeat, prompt), read from the committed tiny sweep (a real run of the CLI)."""

from __future__ import annotations

import pytest

from analysis.comparison import main, paired_decode
from harness import rundir
from harness.errors import SpectuneError
from harness.stats.compare import decode_clusters


def test_a_pair_is_the_ratio_of_pooled_decode_rates_on_shared_clusters(tiny_sweep):
    """One row per job (concurrency 1 and 2); the estimate is Σ tokens after the first / Σ decode time of A over
    B's on the clusters both completed (computed here from requests.parquet); a method against itself is 0%."""
    table = paired_decode(tiny_sweep, "fixed:gamma=1", "ar", seed=0)
    assert sorted(table["concurrency"]) == [1, 2]
    for _, row in table.iterrows():
        requests = rundir.REQUESTS.read(row["run"])
        clusters = decode_clusters(requests[requests["method"].isin(["fixed:gamma=1", "ar"])])
        rate = {m: clusters.num[m].sum() / clusters.den[m].sum() for m in ("fixed:gamma=1", "ar")}
        assert row["clusters"] == len(clusters.keys) > 1
        assert row["a_vs_b_pct"] == pytest.approx(100 * (rate["fixed:gamma=1"] / rate["ar"] - 1), rel=1e-9)
        assert row["ci95_lo"] <= row["a_vs_b_pct"] <= row["ci95_hi"]
    same = paired_decode(tiny_sweep, "ar", "ar", seed=0)
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
