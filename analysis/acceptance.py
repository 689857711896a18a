"""`python -m analysis.acceptance A B`: two drafts' α on the same prompts, paired.

``task=acceptance`` samples the target's continuations from the workload's seed, so two drafts measured with the
same target, workload and sampling settings are scored on the same positions. Their difference is then read
paired: prompts are the units (a prompt's positions are not independent), and the interval of the difference of the
two pooled α is taken over the same prompts (:func:`spectune.stats.intervals.paired_difference_interval`), which is
much tighter than comparing two separate intervals. Runs whose prompts or continuations differ are refused: their
α are not paired.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np

from spectune.errors import SpectuneError
from spectune.run import cli, rundir
from spectune.stats.intervals import paired_difference_interval

log = logging.getLogger(__name__)


def read_acceptance(path: Path | str) -> dict[str, Any]:
    """An acceptance result from its run directory or its ``acceptance.json``, with per-prompt rows."""
    path = Path(path)
    data = rundir.read_json(path if path.is_file() else rundir.ACCEPTANCE.path(path))
    if data.get("task") != "acceptance" or "alpha_per_prompt" not in data:
        raise SpectuneError(f"{path} is not a task=acceptance result with per-prompt rows (alpha_per_prompt); "
                            "rerun task=acceptance to get them")
    return data


def paired_alpha(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """α of A and of B and A − B with its 95% interval over prompts; the same prompts and positions required."""
    rows_a, rows_b = a["alpha_per_prompt"], b["alpha_per_prompt"]
    key_a = [(r["id"], r["positions"]) for r in rows_a]
    key_b = [(r["id"], r["positions"]) for r in rows_b]
    if key_a != key_b:
        raise SpectuneError(f"the runs are not paired: {len(key_a)} and {len(key_b)} prompts, "
                            f"{sum(x != y for x, y in zip(key_a, key_b, strict=False))} differing in id or length; "
                            "measure both with the same target, workload and sampling settings")
    counts = np.array([r["positions"] for r in rows_a], dtype=float)
    sums_a = np.array([r["alpha"] for r in rows_a]) * counts
    sums_b = np.array([r["alpha"] for r in rows_b]) * counts
    diff = paired_difference_interval(sums_a, counts, sums_b, counts)
    better = sum(x["alpha"] > y["alpha"] for x, y in zip(rows_a, rows_b, strict=True))
    worse = sum(x["alpha"] < y["alpha"] for x, y in zip(rows_a, rows_b, strict=True))
    return {"alpha_a": float(sums_a.sum() / counts.sum()), "alpha_b": float(sums_b.sum() / counts.sum()),
            "difference": diff.as_dict(), "prompts": len(rows_a), "positions": int(counts.sum()),
            "prompts_a_higher": better, "prompts_b_higher": worse}


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m analysis.acceptance", description=__doc__.splitlines()[0])
    parser.add_argument("a", help="task=acceptance run directory (or its acceptance.json)")
    parser.add_argument("b", help="the same, for the draft compared against")
    return cli.run_command(parser, _print, argv)


def _print(args: argparse.Namespace) -> None:
    r = paired_alpha(read_acceptance(args.a), read_acceptance(args.b))
    d = r["difference"]
    log.info(f"{r['prompts']} prompts, {r['positions']} positions: alpha A {r['alpha_a']:.4f}, B {r['alpha_b']:.4f}; "
             f"A - B {d['estimate']:+.4f} (95% CI {d['lo']:+.4f} to {d['hi']:+.4f}, {d['method']}: prompts); "
             f"A higher on {r['prompts_a_higher']} prompts, B on {r['prompts_b_higher']}")


if __name__ == "__main__":
    raise SystemExit(main())


def format_alpha_by_category(by_category: dict[str, dict[str, Any]]) -> str:
    """``acceptance.json``'s ``alpha_by_category`` as the lines ``task=acceptance`` prints: α with its interval over
    the category's prompts, its share of the positions, and what the target did (stops, repetition)."""
    lines = ["alpha by category (95% CI over the category's prompts; positions %: the category's share of all "
             "positions):"]
    for category, e in by_category.items():
        share = 100 * (e.get("position_share") or 0.0)
        lines.append(f"  {category}: {e['alpha']:.4f} [{e['alpha_ci95_lo']:.4f}, {e['alpha_ci95_hi']:.4f}]  "
                     f"{e['prompts']} prompts, {e['positions']} positions ({share:.1f}%); target stopped in "
                     f"{100 * e.get('stop_share', float('nan')):.0f}%, median 4-gram repetition "
                     f"{e.get('repetition_p50', float('nan')):.2f}")
    return "\n".join(lines)
