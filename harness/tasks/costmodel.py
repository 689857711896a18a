"""`python -m harness task=costmodel`: sweep the cost model and report the best γ per (α, c).

Writes ``costmodel.csv`` (every grid point), ``costmodel.json`` (parameters, optima, metadata) and
``costmodel.png`` (S against γ) into the run directory. The model lives in :mod:`analysis.costmodel`;
this module only reads the config, validates it and formats the output.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from analysis.costmodel.model import (
    DRAFTS,
    VerifyCost,
    check_alpha,
    check_cost,
    expected_tokens_from_joint,
    optima,
    plot,
    sweep,
)
from spectune.errors import SpectuneError
from spectune.options import as_list, check_gamma, flag, required
from spectune.run import rundir
from spectune.run.metadata import base_metadata

log = logging.getLogger(__name__)


def _verify_cost(raw: Any) -> VerifyCost:
    """``task.g``: a number, a list (entry i is g(i+1)) or a mapping {γ: cost}."""
    if isinstance(raw, DictConfig):
        table = OmegaConf.to_container(raw, resolve=True)
        try:
            return {int(k): v for k, v in table.items()}
        except ValueError:
            raise SpectuneError(f"task.g={table!r} is invalid: table keys must be integers γ >= 1") from None
    if isinstance(raw, ListConfig | list):
        return as_list(raw, "task.g")
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return raw
    raise SpectuneError(f"task.g={raw!r} is invalid: give a number, a list g(1)..g(n) or a table {{γ: cost}} "
                        "(target steps, > 0)")


def _settings(cfg: DictConfig) -> dict[str, Any]:
    """Validate every task.* value (defaults live in conf/task/costmodel.yaml only)."""
    task = cfg.task

    def get(key: str) -> Any:
        return required(task, key, f"task.{key}")

    gamma_min = check_gamma(get("gamma_min"), DRAFTS, key="task.gamma_min")
    gamma_max = check_gamma(get("gamma_max"), DRAFTS, key="task.gamma_max")
    if gamma_max < gamma_min:
        raise SpectuneError(f"task.gamma_max={gamma_max} is below task.gamma_min={gamma_min}: "
                            "must be >= gamma_min")
    raw_alphas = as_list(get("alphas"), "task.alphas")
    alphas = [check_alpha(a, f"task.alphas[{i}]") for i, a in enumerate(raw_alphas)]
    cs = [check_cost(c, f"task.cs[{i}]") for i, c in enumerate(as_list(get("cs"), "task.cs"))]
    joint = get("joint")
    if joint is not None:
        joint = as_list(joint, "task.joint")
        expected_tokens_from_joint(joint, "task.joint")  # validates with the CLI's names
    return {
        "alphas": alphas, "cs": cs, "gammas": list(range(gamma_min, gamma_max + 1)),
        "g": _verify_cost(get("g")),
        "overhead": check_cost(get("overhead"), "task.overhead"),
        "joint": joint,
        "plot": flag(get("plot"), "task.plot"),
    }


def run(cfg: DictConfig, run_dir: Path) -> int:
    s = _settings(cfg)
    grid = sweep(s["alphas"], s["cs"], s["gammas"], g=s["g"], overhead=s["overhead"], joint=s["joint"],
                 g_name="task.g")
    best = optima(grid)

    g_text = s["g"] if not isinstance(s["g"], list | dict) else "table"
    log.info(f"Cost model: S = E / (c*γ + g(γ) + overhead), γ = {s['gammas'][0]}..{s['gammas'][-1]}, "
             f"g = {g_text}, overhead = {s['overhead']:g}")
    log.info("E = (1 - α^(γ+1)) / (1 - α) for constant α" + ("; 'joint' uses E = 1 + Σ P(first i accepted)"
                                                             if s["joint"] is not None else ""))
    log.info(f"{'series':>10} {'c':>6} {'best γ':>7} {'E':>10} {'cost':>8} {'S':>8}")
    for row in best.itertuples(index=False):
        log.info(f"{row.series:>10} {row.c:>6g} {row.gamma:>7d} {row.E:>10.6f} {row.cost:>8.4f} {row.S:>8.4f}")
    slower = best[best["S"] < 1]
    if len(slower):
        log.info(f"note: {len(slower)} optimum/optima have S < 1: speculative decoding would be slower there")

    paths = [rundir.COSTMODEL_CSV.write(run_dir, grid)]
    paths.append(rundir.COSTMODEL_JSON.write(run_dir, {
        "task": "costmodel",
        "model": "S = E / (c*gamma + g(gamma) + overhead); E = (1 - alpha^(gamma+1)) / (1 - alpha), "
                 "gamma + 1 at alpha = 1; joint: E = 1 + sum_i P(first i accepted)",
        "parameters": {"alphas": s["alphas"], "cs": s["cs"], "gammas": s["gammas"], "g": s["g"],
                       "overhead": s["overhead"], "joint": s["joint"]},
        "optima": best.to_dict(orient="records"),
        "metadata": base_metadata(),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }))
    if s["plot"]:
        fig = plot(grid, best)
        paths.append(rundir.COSTMODEL_PNG.write(run_dir, fig))
    for path in paths:
        log.info(f"wrote {path}")
    return 0
