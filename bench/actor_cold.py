"""What a PPO actor call costs on cold caches, as inside the engine, beside the same call warm.

Inside the engine a policy decides between forwards that have just evicted the caches; there every numpy call
costs ~10 µs, so the number of calls, not the arithmetic, is the cost. This script times one actor (an SB3
default MLP: tanh, two hidden layers of 64) four ways, interleaved, right after a matrix product that touches
``--evict-mb`` of weights and again warm: layer by layer with a clip and torch actions (what the engine ran
before); the same without clip and torch; the biases carried inside the products by a constant unit (a hidden
unit whose activation is exactly 1: three numpy calls fewer, in-place activations); and
:class:`policies.numpy_actor.NumpyActor` as the engine calls it. Prints the median µs per call of each.

    python bench/actor_cold.py --rows 1 --features 5 --actions 9 --calls 400
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from policies.envs.observation import OBS_HIGH
from policies.numpy_actor import NumpyActor, numpy_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1, help="observations per call (the batch's rows)")
    parser.add_argument("--features", type=int, default=5, help="observation width (5: the cycle policy's)")
    parser.add_argument("--actions", type=int, default=9, help="logits (9: γ 0..8)")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--evict-mb", type=int, default=16, help="megabytes of weights the product in between reads")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    net = torch.nn.Sequential(torch.nn.Linear(args.features, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, args.actions))
    layers, actor = numpy_layers(net), NumpyActor(net)
    k = np.float32(20.0)  # tanh(20) is 1 in float32: the constant unit
    w1 = np.concatenate([layers[0][0], np.zeros((args.features, 1), np.float32)], 1)
    b1 = np.append(layers[0][1], k).astype(np.float32)
    w2 = np.zeros((65, 65), np.float32)
    w2[:64, :64], w2[64, :64], w2[64, 64] = layers[1][0], layers[1][1], k
    w3 = np.concatenate([layers[2][0], layers[2][1][None]], 0)
    obs = np.random.default_rng(0).uniform(0, 2, (args.rows, args.features)).astype(np.float32)

    def plain_clip() -> list:
        h = np.clip(obs, 0, OBS_HIGH)
        for weight, bias, activation in layers:
            h = h @ weight + bias
            h = activation(h) if activation is not None else h
        return torch.from_numpy(h.argmax(-1)).tolist()

    def carried() -> list:
        h = np.dot(obs, w1)
        h += b1
        np.tanh(h, out=h)
        h = np.dot(h, w2)
        np.tanh(h, out=h)
        return np.dot(h, w3).argmax(-1).tolist()

    def plain() -> list:
        h = obs
        for weight, bias, activation in layers:
            h = h @ weight + bias
            h = activation(h) if activation is not None else h
        return h.argmax(-1).tolist()

    generator = torch.Generator()

    def engine() -> list:
        return actor.actions(obs, True, generator).tolist()

    methods = {"layer by layer, clip, torch actions": plain_clip, "layer by layer": plain,
               "biases carried by a constant unit": carried, "NumpyActor (the engine's)": engine}
    assert len({tuple(f()) for f in methods.values()}) == 1
    x = torch.randn(8, 1024)
    w = torch.randn(1024, args.evict_mb * 2**20 // 4 // 1024)
    cold: dict[str, list[float]] = {name: [] for name in methods}
    warm: dict[str, list[float]] = {name: [] for name in methods}
    items = list(methods.items())
    for i in range(args.calls):
        for name, f in items if i % 2 else items[::-1]:  # alternate the order
            float((x @ w).sum())
            start = time.perf_counter()
            f()
            cold[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            f()
            warm[name].append(time.perf_counter() - start)
    print(f"actor {args.features}→64→64→{args.actions} (tanh), {args.rows} row(s), {args.calls} calls each, "
          f"after a product over {args.evict_mb} MB, torch threads {args.threads}; median µs per call")
    for name in methods:
        print(f"  {name:38s} cold {np.median(cold[name]) * 1e6:7.1f}   warm {np.median(warm[name]) * 1e6:6.1f}")


if __name__ == "__main__":
    main()
