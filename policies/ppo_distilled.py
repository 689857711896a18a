"""The per-step PPO γ policy distilled into one q(x) threshold per draft step: its stops at a comparison's cost.

Why: inside the engine the per-step network decides between forwards that have just evicted the caches, where
its numpy calls cost ~75 µs a decision, and it reads four draft signals (entropy and margin over the whole
vocabulary). Measured: 2.9% of a tiny-pair cycle; on smollm2 as much as its choices gained in replay. A rule that
compares the drafted token's q(x) with a number costs one tensor comparison and reads q(x) only.

So the network is replayed on the training traces it learned from (:func:`distill`: its own decisions, taken
exactly as in the engine, through :func:`policies.envs.replay.replay_gammas`) and, at each draft step, the threshold
whose rule "continue iff q(x) ≥ τ" agrees with the most of the network's decisions there is kept (exact, over
every distinct q(x); :func:`best_threshold`). The step-0 decision (speculate this cycle at all, taken before
anything is drafted) is distilled the same way into a threshold on each row's recent acceptance: a cycle speculates
iff some row's is ≥ τ_start, so no network runs at all. What a threshold cannot keep (the network's use of
context, recent acceptance, entropy, margin) shows as the agreement per step, recorded with the thresholds.

``policies.train`` writes the distillation into ``gamma.zip``'s ``spectune.json`` (key ``distilled``), so
``policy=ppo-distilled policy.gamma_path=RUN/gamma.zip`` needs nothing else; a file trained before (or new traces):

    python -m policies.ppo_distilled GAMMA.zip TRACES.parquet [--profile PROFILE] [--max-gamma N]
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas, replay_scores
from policies.ppo import PPOGamma
from policies.sb3_files import PolicyFile, annotate_policy_file, read_policy_file
from spectune.costmodel.profile import Profile
from spectune.engine.policy import DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.run import cli

log = logging.getLogger(__name__)
NEVER = 2.0  # a threshold above every probability: stop (the network stopped every row it decided at that step)


def best_threshold(probs: np.ndarray, keeps: np.ndarray) -> tuple[float, int]:
    """(τ, decisions matched) for the rule "continue iff prob ≥ τ" against decisions ``keeps`` (True: continue).

    Every split of the sorted probabilities is tried (none continue, all continue, and between each pair of
    distinct values); τ is the midpoint between the two values a split separates (0 when all continue,
    :data:`NEVER` when none do). Ties in matches go to the lowest τ (the deeper draft)."""
    if probs.size == 0:
        raise SpectuneError("best_threshold needs at least one decision")
    order = np.argsort(probs, kind="stable")
    p, keep = probs[order], keeps[order].astype(np.int64)
    n = p.size
    # split j: rows [j, n) continue. Only splits at the first index of a distinct value (and n) separate values.
    starts = np.r_[0, np.nonzero(np.diff(p))[0] + 1, n]
    stops_below = np.r_[0, np.cumsum(1 - keep)][starts]
    keeps_above = int(keep.sum()) - np.r_[0, np.cumsum(keep)][starts]
    matched = stops_below + keeps_above
    best = int(np.argmax(matched))  # first maximum: the lowest τ
    j = int(starts[best])
    tau = 0.0 if j == 0 else NEVER if j == n else float((p[j - 1] + p[j]) / 2)
    return tau, int(matched[best])


@dataclass(frozen=True)
class Distillation:
    """Thresholds per draft step (``thresholds[k]`` decides after draft step k, 0-based, as ``DraftStep.step``),
    the network's decisions seen at each step, the share the threshold matches, and both rules' replay decode
    tokens/s on the traces distilled from (the network's, then the thresholds'). ``start_threshold`` is the
    step-0 rule's (speculate iff a row's recent acceptance ≥ it; None: the network never decided a step 0, so
    the distilled policy keeps asking it), with its decisions (rows) and agreement."""

    thresholds: tuple[float, ...]
    decisions: tuple[int, ...]
    agreement: tuple[float | None, ...]
    network_tok_s: float
    distilled_tok_s: float
    start_threshold: float | None = None
    start_decisions: int = 0
    start_agreement: float | None = None

    @property
    def overall(self) -> float | None:
        """Matched decisions over every step (None when the network never decided after a draft)."""
        total = sum(self.decisions)
        if not total:
            return None
        return sum(a * d for a, d in zip(self.agreement, self.decisions, strict=True) if a is not None) / total

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "thresholds": list(self.thresholds), "decisions": list(self.decisions),
                "agreement": list(self.agreement), "overall_agreement": self.overall}


class _Recording(DraftLengthPolicy):
    """A policy that passes every call to ``inner`` and keeps, per draft step, the busy rows' q(x) and decisions."""

    def __init__(self, inner: PPOGamma, steps: int) -> None:
        self.inner, self.name, self.reads_context = inner, inner.name, inner.reads_context
        self.shadow_trials = inner.shadow_trials
        self.signals = inner.signals | {"token_prob"}
        self.seen: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []) for _ in range(steps)]
        self.start: list[tuple[float, bool]] = []  # (recent acceptance, speculate) per row of each decided step 0

    def reset(self) -> None:
        self.inner.reset()

    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None) -> None:
        self.inner.before_cycle(rows, request_ids, context_lengths)

    def begin_cycle(self, batch_size: int) -> int:
        gamma = self.inner.begin_cycle(batch_size)
        for row, speculate in (self.inner.start or {}).items():
            self.start.append((self.inner.history.rate(row), speculate))
        return gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        keep = self.inner.continue_drafting(step)
        active = step.active & (step.context_length > 0)
        probs, keeps = self.seen[step.step]
        probs.append(step.token_prob[active].double().numpy())
        keeps.append(keep[active].numpy())
        return keep

    def observe(self, feedback) -> None:
        self.inner.observe(feedback)


def distill(gamma_path: str | Path, traces: TraceSet, profile: Profile | None, max_gamma: int | None,
            trust_pickle: bool = False, policy_file: PolicyFile | None = None) -> Distillation:
    """Replay the deterministic per-step policy of ``gamma_path`` on ``traces`` (its decisions exactly as the
    engine takes them, ``profile``'s costs fed back; None: the profile and ``max_gamma`` the file was trained
    with) and fit one threshold per draft step 0..max_gamma − 2 (the step after the ceiling's draft is not
    decided) and one for step 0 on recent acceptance. A step the network never reached takes the threshold of
    the step before it (:data:`NEVER` at the first). ``policy_file``: the file already read (else read here, once
    for the network and the thresholds' rule both)."""
    policy_file = policy_file or read_policy_file(gamma_path, "gamma", trust_pickle)
    if max_gamma is None:
        max_gamma = policy_file.extra.get("max_gamma")
        if not isinstance(max_gamma, int) or isinstance(max_gamma, bool) or max_gamma < 1:
            raise SpectuneError(f"gamma={str(gamma_path)!r} names no max_gamma in its spectune.json: give --max-gamma")
    node = dict(gamma_path=str(gamma_path), trust_pickle=trust_pickle, profile=None, allow_profile_mismatch=True,
                policy_file=policy_file)
    network = PPOGamma(max_gamma, **node, deterministic=True, seed=0)
    profile = profile or network.profile
    if profile is None:
        raise SpectuneError(f"gamma={str(gamma_path)!r} names no profile of its own: give --profile PROFILE")
    recording = _Recording(network, max(max_gamma - 1, 1))
    gammas = replay_gammas(recording, traces, max_gamma, profile)
    thresholds, decisions, agreement = [], [], []
    for probs, keeps in recording.seen:
        p = np.concatenate(probs) if probs else np.zeros(0)
        k = np.concatenate(keeps).astype(bool) if keeps else np.zeros(0, dtype=bool)
        if p.size:
            tau, matched = best_threshold(p, k)
            agreement.append(matched / p.size)
        else:
            tau = thresholds[-1] if thresholds else NEVER
            agreement.append(None)
        thresholds.append(tau)
        decisions.append(int(p.size))
    start, start_agreement = None, None
    if recording.start:
        rates, speculate = (np.asarray(column) for column in zip(*recording.start, strict=True))
        start, matched = best_threshold(rates.astype(np.float64), speculate.astype(bool))
        start_agreement = matched / rates.size
    rule = PPODistilled(max_gamma, thresholds=thresholds, start_threshold=start, **node)
    distilled = replay_gammas(rule, traces, max_gamma, profile)

    def tok_s(chosen: np.ndarray) -> float:
        return float(replay_scores(traces, profile, max_gamma, chosen, rate="request", oracles=False)["policy_tok_s"])

    return Distillation(tuple(thresholds), tuple(decisions), tuple(agreement), tok_s(gammas), tok_s(distilled),
                        start, len(recording.start), start_agreement)


def distill_into(gamma_path: str | Path, traces: TraceSet, profile: Profile | None,
                 max_gamma: int | None) -> Distillation:
    """:func:`distill` the file and store the result in its ``spectune.json`` (key ``distilled``, the rest kept),
    where ``policy=ppo-distilled`` reads it. The file is read once."""
    policy_file = read_policy_file(gamma_path, "gamma")
    result = distill(gamma_path, traces, profile, max_gamma, policy_file=policy_file)
    annotate_policy_file(gamma_path, {**policy_file.extra, "distilled": result.to_json()})
    return result


def check_thresholds(thresholds: Any, key: str) -> tuple[float, ...]:
    """A non-empty list of numbers ≥ 0 (``NEVER`` or more: always stop), or one line naming the bad value."""
    if isinstance(thresholds, str | bytes) or not isinstance(thresholds, Sequence) or not thresholds or any(
            isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0 for t in thresholds):
        raise SpectuneError(f"{key}={thresholds!r} is invalid: a non-empty list of numbers >= 0, one per draft step")
    return tuple(float(t) for t in thresholds)


class PPODistilled(PPOGamma):
    """The PPO γ policy of ``gamma_path`` with its decisions replaced by :func:`distill`'s thresholds: a cycle
    speculates iff some row's recent acceptance is ≥ ``start_threshold`` (a new request's, before any cycle, is
    the prior 0.5), and after draft step k a row continues iff q(x) ≥ ``thresholds[k]`` (the last threshold
    beyond the list). Null thresholds: the file's own (``distilled`` in its ``spectune.json``, written by
    ``policies.train``). A file distilled without a step-0 threshold keeps the network's step-0 decision.

    No network runs: the engine computes q(x) alone for it, and step 0 reads the acceptance it already counts."""

    name = "ppo-distilled"

    def __init__(self, gamma: int, gamma_path: str | None, trust_pickle: bool, profile: str | None,
                 allow_profile_mismatch: bool, thresholds: Sequence[float] | None = None,
                 start_threshold: float | None = None, *, policy_file: PolicyFile | None = None) -> None:
        super().__init__(gamma, gamma_path, trust_pickle, profile, allow_profile_mismatch, deterministic=True, seed=0,
                         policy_file=policy_file)
        stored = self.file.extra.get("distilled")
        if thresholds is None:
            if not isinstance(stored, dict) or "thresholds" not in stored:
                raise SpectuneError(f"policy.gamma_path={gamma_path!r} holds no distilled thresholds (files written "
                                    "by python -m policies.train do): give policy.thresholds=[...] or retrain")
            thresholds = stored["thresholds"]
            if start_threshold is None:
                start_threshold = stored.get("start_threshold")
        self.thresholds = check_thresholds(thresholds, "policy.thresholds")
        if start_threshold is not None and (isinstance(start_threshold, bool) or not isinstance(
                start_threshold, int | float) or not start_threshold >= 0):
            raise SpectuneError(f"policy.start_threshold={start_threshold!r} is invalid: null or a number >= 0 (0: "
                                "always speculate; above 1: never)")
        self.start_threshold = None if start_threshold is None else float(start_threshold)
        if self.start_threshold is None:
            log.info("policy.gamma_path=%s has no step-0 threshold: the network decides whether a cycle speculates "
                     "(python -m policies.ppo_distilled distils one)", gamma_path)
        self.signals = frozenset({"token_prob"})
        self.split = None

    def begin_cycle(self, batch_size: int) -> int:
        if self.start_threshold is None:
            return super().begin_cycle(batch_size)
        start = self.start_rows(batch_size)
        if start is None:
            return self.max_gamma
        rate, tau = self.history.rate, self.start_threshold
        return self.max_gamma if any(rate(row) >= tau for row in start[0]) else 0

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        if step.step == 0:
            self.see_first_step(step)
        return step.token_prob >= self.thresholds[min(step.step, len(self.thresholds) - 1)]

    def describe(self) -> dict:
        return {**super().describe(), "name": self.name, "thresholds": list(self.thresholds),
                "start_threshold": self.start_threshold,
                "start": "network" if self.start_threshold is None else "recent acceptance threshold"}


def main(argv: list[str] | None = None) -> int:
    """``python -m policies.ppo_distilled GAMMA.zip TRACES.parquet``: distil a γ policy file on traces (a file
    written before ``policies.train`` did it, or other traces) and store the thresholds in the file."""
    parser = cli.ArgumentParser(prog="python -m policies.ppo_distilled", description=main.__doc__.splitlines()[0])
    parser.add_argument("gamma", help="a gamma.zip of python -m policies.train")
    parser.add_argument("traces", help="traces.parquet of python -m harness task=trace (the training prompts')")
    parser.add_argument("--profile", default=None, help="cost profile (default: the one the file was trained for)")
    parser.add_argument("--max-gamma", type=int, default=None, help="ceiling (default: the file's max_gamma)")
    return cli.run_command(parser, _distill_file, argv)


def _distill_file(args: argparse.Namespace) -> None:
    from spectune.costmodel.profile import load_profile

    if args.max_gamma is not None and args.max_gamma < 1:
        raise SpectuneError(f"--max-gamma={args.max_gamma} is invalid: an integer >= 1")
    traces = TraceSet.load(args.traces)
    result = distill_into(args.gamma, traces, load_profile(args.profile) if args.profile else None, args.max_gamma)
    log.info("thresholds per draft step %s, agreement %s (overall %s); step 0: recent acceptance >= %s, agreement "
             "%s over %d rows; replay %.1f tok/s against the network's %.1f; written into %s",
             [round(t, 4) for t in result.thresholds], [None if a is None else round(a, 3) for a in result.agreement],
             result.overall, result.start_threshold, result.start_agreement, result.start_decisions,
             result.distilled_tok_s, result.network_tok_s, args.gamma)


if __name__ == "__main__":
    raise SystemExit(main())
