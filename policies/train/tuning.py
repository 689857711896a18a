"""Threshold baselines tuned on the training prompts, with the budget PPO gets: the same traces, the same profile.

A published default (transformers' confidence threshold 0.4, SVIP's h = 0.3, ...) was chosen on other models;
comparing a PPO policy trained on this pair's traces against thresholds tuned elsewhere flatters PPO. So each
threshold baseline is replayed (:func:`policies.envs.replay.replay_gammas`) over the training traces at every value
of its grid, with the cost profile PPO was trained with, and the value with the highest replay decode tokens/s
(the comparison's metric, pooled over requests; ties: the one listed first) is the one evaluated on the held-out
prompts. Adaptive thresholds (confidence-adaptive, AdaEDL) adapt online from the tuned start.

Each policy's grid is its class's ``tuning`` attribute (parameter, values), beside the rule it tunes.
``step-thresholds`` has a threshold per draft step: too many combinations to try them all (15 values at 7 steps
is 1.7e8), so :func:`tune_steps` searches coordinate by coordinate from the best single threshold.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas, replay_scores
from policies.registry import POLICIES, make_policy
from spectune.costmodel.profile import Profile

log = logging.getLogger(__name__)

STEP_PASSES = 2  # coordinate passes over the steps; a pass that improves nothing ends the search early


def grid(name: str) -> tuple[str, tuple[Any, ...]] | None:
    """(parameter, values) a policy tunes in replay: its class's ``tuning`` (None: nothing to tune)."""
    return getattr(POLICIES[name], "tuning", None) if name in POLICIES else None


def tunable(names: Iterable[str]) -> list[str]:
    """The policies among ``names`` that have a grid (only their modules are imported)."""
    return [name for name in names if grid(name) is not None]


def __getattr__(attribute: str) -> Any:
    """``GRIDS``: every tunable policy's grid, by name (imports every policy module: read it only when all are
    wanted)."""
    if attribute == "GRIDS":
        return {name: grid(name) for name in POLICIES if grid(name) is not None}
    raise AttributeError(attribute)


def tune(nodes: Mapping[str, dict[str, Any]], traces: TraceSet, profile: Profile, max_gamma: int
         ) -> tuple[dict[str, dict[str, Any]], pd.DataFrame]:
    """(the nodes with their tuned value, one row per (policy, value) tried with its replay tokens/s).

    ``nodes`` are the policies' config nodes (name and parameters, files included); those without a grid are
    returned unchanged.
    """
    tuned = dict(nodes)
    rows = []
    for label, node in nodes.items():
        name = node.get("name", label)
        if grid(name) is None:
            continue
        parameter, values = grid(name)
        if name == "step-thresholds":
            tuned[label], tried = tune_steps(label, node, traces, profile, max_gamma)
            rows.extend(tried)
            continue
        scores = []
        for value in values:
            policy = make_policy({**node, parameter: value}, max_gamma)
            gammas = replay_gammas(policy, traces, max_gamma, profile)
            tok_s = float(replay_scores(traces, profile, max_gamma, gammas, rate="request",
                                         oracles=False)["policy_tok_s"])
            scores.append(tok_s)
            rows.append({"policy": label, "parameter": parameter, "value": value, "replay_tok_s": tok_s,
                         "mean_gamma": float(np.mean(gammas)), "default": node.get(parameter) == value})
        best = values[int(np.argmax(scores))]
        tuned[label] = {**node, parameter: best}
        log.info("tuned %s: %s=%s (replay %.1f tok/s; default %s=%s)", label, parameter, best, max(scores),
                 parameter, node.get(parameter))
    table = pd.DataFrame(rows)
    if len(table):
        table["chosen"] = [_same(tuned[p][param], v) for p, param, v in zip(table["policy"], table["parameter"],
                                                                            table["value"], strict=True)]
    return tuned, table


def _same(chosen: Any, tried: Any) -> bool:
    """Whether a tried value is the chosen one (a vector is tried as a tuple, stored in the node as a list)."""
    return list(chosen) == list(tried) if isinstance(tried, tuple) else chosen == tried


def tune_steps(label: str, node: Mapping[str, Any], traces: TraceSet, profile: Profile, max_gamma: int
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(``node`` with the tuned per-step thresholds, one row per setting tried).

    Start from the best single threshold applied at every step, then set each step's threshold in turn to the
    value with the best replay tokens/s, the others held (ties keep the current value), for up to
    :data:`STEP_PASSES` passes. A step's threshold decides after that draft step, so steps 0..max_gamma − 2
    decide (the draft at the ceiling stops anyway). Rows record the whole vector as ``value`` (a tuple)."""
    _, values = grid("step-thresholds")
    steps = max(max_gamma - 1, 1)
    cache: dict[tuple[float, ...], float] = {}
    rows: list[dict[str, Any]] = []

    def score(thresholds: tuple[float, ...]) -> float:
        if thresholds not in cache:
            policy = make_policy({**node, "thresholds": list(thresholds)}, max_gamma)
            gammas = replay_gammas(policy, traces, max_gamma, profile)
            cache[thresholds] = float(replay_scores(traces, profile, max_gamma, gammas, rate="request",
                                                    oracles=False)["policy_tok_s"])
            rows.append({"policy": label, "parameter": "thresholds", "value": thresholds,
                         "replay_tok_s": cache[thresholds], "mean_gamma": float(np.mean(gammas)), "default": False})
        return cache[thresholds]

    best = max(((value,) * steps for value in values), key=score)  # first maximum: the lowest value
    for _ in range(STEP_PASSES):
        start = best
        for step in range(steps):
            for value in values:
                candidate = (*best[:step], value, *best[step + 1:])
                if score(candidate) > score(best):
                    best = candidate
        if best == start:
            break
    log.info("tuned %s: thresholds=%s (replay %.1f tok/s, %d settings tried)", label, list(best), score(best),
             len(cache))
    return {**node, "thresholds": list(best)}, rows
