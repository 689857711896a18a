"""A SpecDec++-style stop: a small model predicts, from the draft's signals, whether each drafted token will be
accepted; a row stops once P(at least one rejection so far) = 1 − Π p_acc exceeds a threshold.

SpecDec++ (COLM 2025) reads the draft's hidden state; this variant reads the signals recorded in traces
(``FEATURES``), so it can be fitted on ``traces.parquet`` without touching the models. The fitted model is a JSON
file of numbers (no code): logistic regression (no hidden layer) or an MLP with tanh hidden layers.

Fitting targets the recorded acceptance probability a_i = min(1, p/q) (a soft label with less variance than the
realised accept/reject) over every recorded position: Π a_j is then the expected survival the stop rule needs.
``target="accepted"`` fits the realised labels instead, on positions up to the first rejection, as SpecDec++.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from spectune.engine.policy import DRAFT_SIGNALS, CycleFeedback, DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.io import write_json
from spectune.options import check_gamma
from spectune.run.metadata import base_metadata

log = logging.getLogger(__name__)

FEATURES = ("token_prob", "entropy", "margin", "cum_prob", "position", "context_length")
KIND = "spectune-acceptance-classifier"


class AcceptanceModel(torch.nn.Module):
    """Standardise → (Linear → tanh)* → Linear → sigmoid: P(the drafted token is accepted)."""

    def __init__(self, features: list[str], hidden: list[int]) -> None:
        super().__init__()
        self.features = list(features)
        self.register_buffer("mean", torch.zeros(len(features), dtype=torch.float64))
        self.register_buffer("std", torch.ones(len(features), dtype=torch.float64))
        sizes = [len(features), *hidden, 1]
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b, dtype=torch.float64)
                                          for a, b in itertools.pairwise(sizes))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = (x - self.mean) / self.std
        for layer in self.layers[:-1]:
            h = torch.tanh(layer(h))
        return self.layers[-1](h).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))

    def to_dict(self) -> dict[str, Any]:
        return {"features": self.features, "mean": self.mean.tolist(), "std": self.std.tolist(),
                "layers": [{"weight": layer.weight.detach().tolist(), "bias": layer.bias.detach().tolist()}
                           for layer in self.layers]}


def load_classifier(path: str | Path) -> AcceptanceModel:
    """Read a fitted model file; anything malformed is one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise SpectuneError(f"policy.weights_path={str(path)!r} is invalid: no such file (fit one with "
                            "python -m policies.train.fit_classifier TRACES.parquet OUT.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("kind") != KIND:
            raise ValueError(f"kind is {data.get('kind')!r}, not {KIND!r}")
        features = list(data["features"])
        unknown = [f for f in features if f not in FEATURES]
        if unknown:
            raise ValueError(f"unknown features {unknown} (allowed: {', '.join(FEATURES)})")
        layers = data["layers"]
        model = AcceptanceModel(features, [len(layer["bias"]) for layer in layers[:-1]])
        with torch.no_grad():
            model.mean.copy_(torch.tensor(data["mean"], dtype=torch.float64))
            model.std.copy_(torch.tensor(data["std"], dtype=torch.float64))
            for module, layer in zip(model.layers, layers, strict=True):
                module.weight.copy_(torch.tensor(layer["weight"], dtype=torch.float64))
                module.bias.copy_(torch.tensor(layer["bias"], dtype=torch.float64))
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise SpectuneError(f"policy.weights_path={str(path)!r} is invalid: not an acceptance-classifier file "
                            f"({err})") from None
    return model.eval()


def fit_classifier(traces: pd.DataFrame, hidden: list[int] | None = None, target: str = "accept_prob",
                   epochs: int = 300, seed: int = 0, features: list[str] | None = None) -> AcceptanceModel:
    """Fit the acceptance model on a traces frame (columns as in ``traces.parquet``), full-batch Adam, seeded."""
    features = list(features or FEATURES)
    if target not in ("accept_prob", "accepted"):
        raise SpectuneError(f"target={target!r} is invalid: choose accept_prob or accepted")
    missing = [c for c in [*features, target, "cycle", "row", "position"] if c not in traces.columns]
    if missing:
        raise SpectuneError(f"traces lack columns {missing}: expected the traces.parquet format")
    frame = traces.sort_values(["cycle", "row", "position"], kind="stable")
    if target == "accepted":  # realised labels only up to the first rejection, as SpecDec++ trains
        first_reject = (frame.assign(_r=~frame["accepted"].astype(bool)).groupby(["cycle", "row"])["_r"].cummax())
        previous = first_reject.groupby([frame["cycle"], frame["row"]]).shift(1, fill_value=False)
        frame = frame[~previous.astype(bool)]
    if frame.empty:
        raise SpectuneError("traces are empty: nothing to fit the acceptance classifier on")
    torch.manual_seed(seed)
    x = torch.tensor(frame[features].to_numpy(np.float64))
    y = torch.tensor(frame[target].to_numpy(np.float64))
    model = AcceptanceModel(features, list(hidden or []))
    with torch.no_grad():
        model.mean.copy_(x.mean(0))
        model.std.copy_(x.std(0).clamp(min=1e-6) if len(x) > 1 else torch.ones(len(features), dtype=torch.float64))
    optimiser = torch.optim.Adam(model.layers.parameters(), lr=0.05)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = loss_fn(model.logits(x), y)
        loss.backward()
        optimiser.step()
    log.info("acceptance classifier: %d rows, features %s, target %s, final BCE %.4f", len(x), features, target,
             float(loss.detach()))
    return model.eval()


def save_classifier(model: AcceptanceModel, path: str | Path, info: dict[str, Any] | None = None) -> Path:
    """Write the model as JSON numbers with its provenance (atomic)."""
    return write_json(path, {"kind": KIND, "version": 1, **model.to_dict(),
                             "metadata": {**base_metadata(), **(info or {})}})


class AcceptanceClassifier(DraftLengthPolicy):
    """Per-row stop once 1 − Π_{j≤i} p_acc(x_j) > ``threshold``; γ (the grid's value) is the ceiling."""

    name = "acceptance-classifier"
    tuning = ("threshold", (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7))  # tuned in replay before an evaluation

    def __init__(self, gamma: int, weights_path: str | None, threshold: float) -> None:
        check_gamma(gamma, "the acceptance-classifier ceiling")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 < threshold < 1.0:
            raise SpectuneError(f"policy.threshold={threshold!r} is invalid: must be a number in (0, 1)")
        if not weights_path:
            raise SpectuneError("policy.weights_path is unset: the acceptance-classifier needs a fitted model file")
        self.max_gamma, self.threshold, self.weights_path = gamma, float(threshold), str(weights_path)
        self.model = load_classifier(weights_path)
        self.signals = frozenset(f for f in self.model.features if f in DRAFT_SIGNALS)
        self.survival: torch.Tensor | None = None

    def begin_cycle(self, batch_size: int) -> int:
        self.survival = None
        return self.max_gamma

    def features_of(self, step: DraftStep) -> torch.Tensor:
        columns = []
        for name in self.model.features:
            if name == "position":
                value = torch.full(step.active.shape, step.step + 1, dtype=torch.float64)
            elif name == "context_length":
                value = step.context_length
            else:
                value = getattr(step, name)
            columns.append(value.to("cpu", torch.float64))
        return torch.stack(columns, dim=1)

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        with torch.no_grad():
            p_acc = self.model(self.features_of(step))
        self.survival = p_acc if step.step == 0 or self.survival is None else self.survival * p_acc
        return (1.0 - self.survival <= self.threshold).to(step.active.device)

    def observe(self, feedback: CycleFeedback) -> None:
        self.survival = None

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "threshold": self.threshold,
                "weights_path": self.weights_path, "features": self.model.features,
                "hidden": [layer.out_features for layer in self.model.layers[:-1]]}
