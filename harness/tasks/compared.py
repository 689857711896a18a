"""``task.compare``: more draft-length policies in the same interleaved grid as ``policy``.

Two policies measured in two runs are compared through each run's own AR, unpaired, with the machine's drift
between the runs in the difference. Listed here, they run beside AR and the grid's own policy, prompt by prompt in
one schedule, so every comparison between them is paired:

    python -m harness +workload=shift-en models=smollm2 proposer=lookup policy=hysteresis 'gamma=[8]' \\
      'task.compare=[{name: fixed, gamma: 4}, {name: match-length}, {name: regime-map, path: map.json}]'

Each entry is a policy's name (``conf/policy/<name>.yaml``), its ``gamma`` (a γ or a list; default the grid's) and
any of its parameters, on top of that file's values; every (policy, γ) is one method, labelled as the grid's are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies.registry import make_policy, policy_config
from spectune.errors import SpectuneError
from spectune.methods import Method
from spectune.options import check_gamma

Compared = tuple[tuple[dict[str, Any], tuple[int, ...]], ...]  # (policy node, its γ values) per entry


def compared_policies(entries: Any, grid: Iterable[int], taken: Iterable[str]) -> Compared:
    """``task.compare`` checked entry by entry (a mapping with a policy ``name``; each γ an integer >= 1; the
    parameters the policy takes, with valid values; no (policy, γ) twice, nor one of ``taken``, the grid's own
    labels): one line naming the entry otherwise, before any model loads."""
    if entries is None:
        return ()
    if not isinstance(entries, list | tuple):
        raise SpectuneError(f"task.compare={entries!r} is invalid: a list of policies, e.g. "
                            "[{name: match-length}, {name: fixed, gamma: 4}]")
    labels = set(taken)
    out = []
    for i, entry in enumerate(entries):
        key = f"task.compare[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise SpectuneError(f"{key}={entry!r} is invalid: a mapping with a policy name, e.g. "
                                "{name: match-length, gamma: 8}")
        node = {**policy_config(entry["name"], f"{key}.name"), **{k: v for k, v in entry.items() if k != "gamma"}}
        given = entry.get("gamma", list(grid))
        gammas = tuple(given) if isinstance(given, list | tuple) else (given,)
        if not gammas:
            raise SpectuneError(f"{key}.gamma=[] is invalid: give at least one γ >= 1")
        for gamma in gammas:
            check_gamma(gamma, f"each γ of {key}", key=f"{key}.gamma")
            make_policy(node, gamma)  # an unknown parameter or a bad value: one line
            label = Method(node["name"], gamma).label
            if label in labels:
                raise SpectuneError(f"{key} is invalid: {label} is already in the grid (each policy and γ once)")
            labels.add(label)
        out.append((node, gammas))
    return tuple(out)


def compared_methods(compared: Compared) -> list[Method]:
    """The methods ``task.compare`` adds, in its order: each policy at each of its γ, its node as the settings."""
    return [Method(node["name"], gamma, settings=node) for node, gammas in compared for gamma in gammas]
