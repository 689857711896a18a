"""Stop drafting when the draft doubts itself (transformers' `assistant_confidence_threshold`, DISCO-style)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from policies.rows import RowTracker
from spectune.engine.policy import CycleFeedback, DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.options import check_gamma

# The q(x) thresholds policies.evaluate tries in replay (policies.train.tuning): they cover transformers' default
# and what q(x) spans on a flat and on a peaked draft (a drafted token's q(x) has a median of 0.0024 on the
# embedded pair, hence the low values).
THRESHOLDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


class ConfidenceStop(DraftLengthPolicy):
    """Draft up to γ tokens (the grid's value is the ceiling); a row stops after a token whose draft
    probability q(x) is below ``threshold``. Per row: in a batch, each sequence stops on its own evidence.

    Static threshold; :class:`AdaptiveConfidence` re-fits it online from accept/reject labels, as HF does.
    """

    name = "confidence"
    signals = frozenset({"token_prob"})
    tuning = ("threshold", THRESHOLDS)  # (parameter, values) tuned in replay before an evaluation

    def __init__(self, gamma: int, threshold: float) -> None:
        check_gamma(gamma, "the confidence policy's ceiling")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 <= threshold <= 1.0:
            raise SpectuneError(f"policy.threshold={threshold!r} is invalid: must be a number in [0, 1]")
        self.max_gamma, self.threshold = gamma, float(threshold)

    def begin_cycle(self, batch_size: int) -> int:
        return self.max_gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return step.token_prob >= self.threshold

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "threshold": self.threshold}



class StepThresholds(DraftLengthPolicy):
    """A q(x) threshold per draft step: after draft step k a row continues iff q(x) ≥ ``thresholds[k]`` (the last
    threshold beyond the list; 0: always continue, above 1: stop there, so a fixed γ below the ceiling is one
    setting of it).

    Why: ``ppo-distilled`` is this rule with thresholds fitted to mimic the PPO network's decisions. Tuned directly
    for throughput in replay on the same training traces (:func:`policies.train.tuning.tune_steps`), it is the baseline
    that tells what the network adds beyond the rule it is distilled into.
    """

    name = "step-thresholds"
    signals = frozenset({"token_prob"})
    tuning = ("thresholds", (0.0, *THRESHOLDS, 2.0))  # per draft step: 0 continues, 2 stops (a shorter ceiling)

    def __init__(self, gamma: int, thresholds: Sequence[float]) -> None:
        check_gamma(gamma, "the step-thresholds ceiling")
        if isinstance(thresholds, str | bytes) or not isinstance(thresholds, Sequence) or not thresholds or any(
                isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0 for t in thresholds):
            raise SpectuneError(f"policy.thresholds={thresholds!r} is invalid: a non-empty list of numbers >= 0, "
                                "one per draft step (0: continue, above 1: stop)")
        self.max_gamma, self.thresholds = gamma, tuple(float(t) for t in thresholds)

    def begin_cycle(self, batch_size: int) -> int:
        return self.max_gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return step.token_prob >= self.thresholds[min(step.step, len(self.thresholds) - 1)]

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "thresholds": list(self.thresholds)}


def roc_threshold(scores: np.ndarray, labels: np.ndarray, fn_weight: float = 3.0) -> float:
    """The score threshold minimising FPR + ``fn_weight``·FNR over the ROC curve of ``scores`` against ``labels``
    (1 = accepted). transformers does this with scikit-learn's ``roc_curve``; this is the same curve in numpy.

    Thresholds are the distinct scores, highest first (predict "accepted" when score >= threshold), after
    ``+inf`` (nothing predicted accepted); ties in cost go to the highest threshold, as ``np.argmin`` on
    scikit-learn's descending thresholds does.
    """
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], labels[order].astype(np.int64)
    distinct = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]  # last index of each distinct score
    tps, fps = np.cumsum(y)[distinct], np.cumsum(1 - y)[distinct]
    tpr = np.r_[0.0, tps / max(int(y.sum()), 1)]
    fpr = np.r_[0.0, fps / max(int((1 - y).sum()), 1)]
    thresholds = np.r_[np.inf, s[distinct]]
    return float(thresholds[int(np.argmin(fpr + fn_weight * (1.0 - tpr)))])


class AdaptiveConfidence(DraftLengthPolicy):
    """transformers' adaptive confidence threshold: the static stop of :class:`ConfidenceStop`, with the threshold
    re-fitted after every cycle from accept/reject labels of the draft probabilities seen so far.

    Labels, as transformers: each accepted draft's q(x) is a 1, the first rejected draft's a 0 (later drafts are
    not labelled). Once more than ``min_samples`` (transformers: 5) labels of both kinds exist, threshold =
    argmin over the ROC of FPR + ``fn_weight``·FNR (transformers: 3). ``scope="request"`` is transformers' own
    behaviour (its candidate generator, and so the labels and threshold, live for one ``generate`` call: each
    request starts again at ``threshold``); ``scope="run"`` pools the labels of every request of the run.

    The draft at the ceiling is not offered to :meth:`continue_drafting` (nothing is left to decide there); its
    probability comes through :meth:`end_drafting`, so the ceiling position is labelled like the others
    (accepted: 1, the first rejection: 0).
    """

    name = "confidence-adaptive"
    tuning = ("threshold", THRESHOLDS)  # its start value
    signals = frozenset({"token_prob"})
    SCOPES = ("request", "run")

    def __init__(self, gamma: int, threshold: float, fn_weight: float, min_samples: int, scope: str) -> None:
        check_gamma(gamma, "the confidence-adaptive ceiling")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 <= threshold <= 1.0:
            raise SpectuneError(f"policy.threshold={threshold!r} is invalid: must be a number in [0, 1]")
        if isinstance(fn_weight, bool) or not isinstance(fn_weight, int | float) or not fn_weight > 0:
            raise SpectuneError(f"policy.fn_weight={fn_weight!r} is invalid: must be a number > 0")
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
            raise SpectuneError(f"policy.min_samples={min_samples!r} is invalid: must be an integer >= 1")
        if scope not in self.SCOPES:
            raise SpectuneError(f"policy.scope={scope!r} is invalid: choose one of {', '.join(self.SCOPES)}")
        self.max_gamma, self.start = gamma, float(threshold)
        self.fn_weight, self.min_samples, self.scope = float(fn_weight), min_samples, scope
        self.rows = RowTracker(["token_prob"])
        self.reset()

    def reset(self) -> None:
        self.rows.reset()
        self.labels: dict[int, tuple[list[float], list[int]]] = {}  # key (slot, or -1 for the run) -> (probs, labels)
        self.thresholds: dict[int, float] = {}
        self.refits = 0

    def _key(self, row: int) -> int:
        return row if self.scope == "request" else -1

    def threshold_of(self, row: int) -> float:
        return self.thresholds.get(self._key(row), self.start)

    def begin_cycle(self, batch_size: int) -> int:
        self.rows.begin_cycle()
        return self.max_gamma

    def _record(self, step: DraftStep) -> None:
        self.rows.on_step(step)
        if step.step == 0 and self.scope == "request":
            for row in self.rows.new_rows:  # a new request starts from the configured threshold
                self.labels.pop(row, None)
                self.thresholds.pop(row, None)

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        self._record(step)
        limits = torch.tensor([self.threshold_of(row) for row in range(step.token_prob.shape[0])],
                              dtype=step.token_prob.dtype, device=step.token_prob.device)
        return step.token_prob >= limits

    def end_drafting(self, step: DraftStep) -> None:
        """Record the last draft step's q(x) when it was not shown to :meth:`continue_drafting` (the ceiling)."""
        if step.step == len(self.rows.steps):
            self._record(step)
        return None

    def observe(self, feedback: CycleFeedback) -> None:
        touched = set()
        for row, _, drafts, accepted, _ in self.rows.outcomes(feedback):
            probs, labels = self.labels.setdefault(self._key(row), ([], []))
            for position in range(1, min(accepted + 1, drafts) + 1):
                prob = self.rows.signal("token_prob", row, position)
                if prob is not None:
                    probs.append(prob)
                    labels.append(1 if position <= accepted else 0)
            touched.add(self._key(row))
        for key in touched:
            probs, labels = self.labels[key]
            if len(probs) > self.min_samples and 0 in labels and 1 in labels:
                self.thresholds[key] = roc_threshold(np.asarray(probs), np.asarray(labels), self.fn_weight)
                self.refits += 1

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "threshold": self.start, "fn_weight": self.fn_weight,
                "min_samples": self.min_samples, "scope": self.scope}
