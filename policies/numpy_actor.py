"""SB3 actors in numpy, for decisions taken between forwards.

The engine calls a policy between forwards that have just evicted the caches, where every numpy call costs ~10 µs
(the archived probe ``actor_cold.py``, bench/results/archive/probes.json, in git history at 2fb8dda: a 5→64→64→9
actor ~8 µs a call warm, ~80–100 µs after a 16 MB matrix product). On cold caches the number of calls is the cost,
so these actors make few: :class:`NumpyActor` runs the network as it is; :class:`SplitActor` takes the per-step γ
decision with the first layer split by how often its inputs change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from spectune.errors import SpectuneError

Layer = tuple[np.ndarray, np.ndarray, Callable | None]


class NumpyActor:
    """An SB3 actor (its Linear layers and tanh/ReLU activations) in numpy, built for calls on cold caches.

    No clip (every field is ≥ 0 and the bound is 1e4, and SB3's ``predict`` does not clip either) and no torch op
    (numpy actions): half the cold cost of the clip-and-torch form. Carrying the biases inside the products through a
    constant unit (three calls fewer) was tried: no cheaper cold, so the products stay plain."""

    def __init__(self, actor: torch.nn.Sequential) -> None:
        self.layers = numpy_layers(actor)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """[B, A] float32 logits of observations [B, F]."""
        h = obs
        for weight, bias, activation in self.layers:
            h = h @ weight + bias
            if activation is not None:
                h = activation(h)
        return h

    def actions(self, obs: np.ndarray, deterministic: bool, generator: torch.Generator) -> np.ndarray:
        """[B] int64 actions: the argmax of the logits, or a draw from their softmax with ``generator``."""
        logits = self.logits(obs)
        if deterministic:
            return logits.argmax(-1)
        return torch.multinomial(torch.softmax(torch.from_numpy(logits), -1), 1, generator=generator).squeeze(1).numpy()


class SplitActor:
    """The argmax decision of a two-action actor, with its first layer split by how often its inputs change.

    Within a cycle only the draft signals change from step to step: the step's constants (position, batch, c, g)
    are the same at that step in every cycle, and a row's context and recent acceptance the same for its whole
    cycle. Their shares of the first layer's pre-activation are therefore computed once per step shape
    (:meth:`step_share`) and once per cycle (:meth:`row_share`); a decision is the signals' product plus those
    shares, the hidden layers, and one logit difference (continue − stop) compared with 0 instead of two logits
    and an argmax. The signals' scales are folded into their weights.

    Args:
        layers: :func:`numpy_layers` of an actor with two outputs.
        features: the observation's field names, in order.
        scales: each field's divisor (``policies.envs.observation.scales``).
        signals: the fields read from the draft step each step; ``step_fields``: those constant per step shape;
            every other field is per row and constant for a cycle.
        choose: the action whose rows :meth:`decide` returns.
    """

    def __init__(self, layers: Sequence[Layer], features: Sequence[str], scales: np.ndarray,
                 signals: frozenset[str], step_fields: frozenset[str], choose: int) -> None:
        (w1, b1, self.first_activation), *rest = layers
        if layers[-1][0].shape[1] != 2:
            raise SpectuneError(f"SplitActor needs an actor with two actions, not {layers[-1][0].shape[1]}")
        w_last, b_last, _ = layers[-1]
        other = 1 - choose
        diff_w = (w_last[:, choose] - w_last[:, other])[:, None].astype(np.float32)
        diff_b = np.float32(b_last[choose] - b_last[other])
        if rest:  # the difference is the last layer's; its bias becomes the threshold
            self.hidden, self.last, self.threshold = list(rest[:-1]), diff_w, -float(diff_b)
        else:  # the first layer is the last: the difference is the first layer's, its bias in the step's share
            w1, b1, self.hidden, self.last, self.threshold = diff_w, np.array([diff_b]), [], None, 0.0
        self.ties_choose = choose == 0  # argmax takes the first of equal logits
        index = {name: i for i, name in enumerate(features)}
        self.signals = tuple(name for name in features if name in signals)
        self.step_fields = tuple(name for name in features if name in step_fields)
        self.row_fields = tuple(name for name in features if name not in signals and name not in step_fields)
        pick = [index[name] for name in self.signals]
        self.signal_weight = (w1[pick] / scales[pick][:, None]).astype(np.float32)
        self.step_weight = w1[[index[name] for name in self.step_fields]]
        self.row_weight = w1[[index[name] for name in self.row_fields]]
        self.step_divisors = [float(scales[index[name]]) for name in self.step_fields]
        self.row_divisors = [float(scales[index[name]]) for name in self.row_fields]
        self.bias = b1

    def step_share(self, values: dict[str, float]) -> np.ndarray:
        """[H]: the first layer's bias plus the step's constants' share (raw values by name, scaled here)."""
        if not self.step_fields:
            return self.bias
        scaled = np.array([values[name] / d for name, d in zip(self.step_fields, self.step_divisors, strict=True)],
                          dtype=np.float32)
        return scaled @ self.step_weight + self.bias

    def row_share(self, columns: dict[str, Sequence[float]], slots: int) -> np.ndarray:
        """[slots, H] (or [H] zeros when no field is per row): the per-row fields' share, from raw columns by name."""
        if not self.row_fields:
            return np.zeros(self.bias.shape, dtype=np.float32)
        scaled = np.array([[columns[name][row] / d for name, d in zip(self.row_fields, self.row_divisors, strict=True)]
                           for row in range(slots)], dtype=np.float32)
        return scaled @ self.row_weight

    def decide(self, signals: np.ndarray, share: np.ndarray) -> np.ndarray:
        """[B] bool: rows whose argmax is the chosen action, from raw signals [B, S] (``self.signals``' order) and
        the summed shares [B, H] or [H]."""
        h = signals @ self.signal_weight
        h += share
        if self.first_activation is not None:
            h = self.first_activation(h)
        for weight, bias, activation in self.hidden:
            h = h @ weight + bias
            if activation is not None:
                h = activation(h)
        out = (h @ self.last)[:, 0] if self.last is not None else h[:, 0]
        return out >= self.threshold if self.ties_choose else out > self.threshold


def numpy_layers(actor: torch.nn.Sequential) -> list[Layer]:
    """An SB3 actor's linear layers as (weightᵀ, bias, activation) float32 numpy arrays, activations as numpy
    functions: x @ Wᵀ + b per layer, what :class:`NumpyActor` runs without torch dispatch."""
    functions = {torch.nn.Tanh: np.tanh, torch.nn.ReLU: lambda x: np.maximum(x, 0), torch.nn.Identity: None}
    layers: list = []
    for module in actor:
        if isinstance(module, torch.nn.Linear):
            layers.append([module.weight.detach().numpy().T.astype(np.float32),
                           module.bias.detach().numpy().astype(np.float32), None])
        elif type(module) in functions:
            layers[-1][2] = functions[type(module)]
        else:
            raise SpectuneError(f"the policy network's activation {module!r} is not supported: tanh or ReLU")
    return [tuple(layer) for layer in layers]
