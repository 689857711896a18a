"""Common random numbers: every uniform the engine uses is keyed by (seed, stream, request, position).

A sequential generator makes every draw depend on everything drawn before it: drafting 3 tokens instead
of 8 shifts every later number, so two policies (or two γ) never see the same luck, and their
difference carries the noise of two independent samples. Keying removes that. Three streams:

- ``draft``: the uniform of the draft token proposed for output position t (inverse-CDF draw from q);
- ``accept``: the acceptance uniform u_t of the draft at output position t (accept iff u_t·q < p);
- ``target``: the uniform of a token drawn from the target at position t (AR step, correction, bonus).

Position t is the 0-based index of the token in the request's output. A cycle of a row that has emitted
``e`` tokens drafts positions e .. e+γ−1 and looks up their uniforms before drafting; the outcome at
γ = k then depends only on positions e .. e+k−1, whatever γ was chosen. Uniforms are reused only
at positions whose earlier use never reached an emitted token (drafts past the first rejection), so every
emitted token's law is still the target's (the engine's law tests check it).

Each request's three tables are drawn once at admission (numpy PCG64 from ``SeedSequence([seed, stream,
request])``) and looked up per cycle by one gather on the device: no host sync, no per-step hashing.
Positions at or past ``max_new_tokens`` are never emitted, so their lookups are clamped to the last entry.
"""

from __future__ import annotations

import numpy as np
import torch

STREAMS: dict[str, int] = {"draft": 1, "accept": 2, "target": 3}


def request_uniforms(seed: int, stream: str, request_id: int, length: int) -> np.ndarray:
    """The ``length`` uniforms of one (seed, stream, request): the same numbers in every run and every policy."""
    entropy = [seed % (1 << 64), STREAMS[stream], request_id % (1 << 64)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy))).random(length)


class KeyedUniforms:
    """Per-slot tables of keyed uniforms, [B, L] per stream, float64 on the engine's device.

    ``enabled=False`` (greedy decoding) keeps zero tables: greedy draws are argmaxes and the greedy
    acceptance test u·q < p with one-hot laws holds for any u < 1, so no numbers are drawn at all.
    """

    def __init__(self, seed: int, batch: int, device: torch.device, enabled: bool = True) -> None:
        self.seed, self.batch, self.device, self.enabled = seed, batch, device, enabled
        self.tables = {name: torch.zeros(batch, 1, dtype=torch.float64, device=device) for name in STREAMS}

    def load(self, row: int, request_id: int, length: int) -> None:
        """Fill slot ``row`` with the uniforms of request ``request_id`` for output positions 0..length-1."""
        if not self.enabled:
            return
        width = self.tables["draft"].shape[1]
        if length > width:
            for name, table in self.tables.items():
                self.tables[name] = torch.nn.functional.pad(table, (0, length - width))
            width = length
        for name, table in self.tables.items():
            values = np.zeros(width)
            values[:length] = request_uniforms(self.seed, name, request_id, length)
            table[row] = torch.from_numpy(values).to(self.device)

    def at(self, stream: str, position: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """Uniforms at ``position [B]`` ([B]) or at position .. position+count−1 ([B, count])."""
        table = self.tables[stream]
        if count is None:
            index = position.unsqueeze(1)
        else:
            index = position.unsqueeze(1) + torch.arange(count, device=position.device)
        values = table.gather(1, index.clamp(max=table.shape[1] - 1))
        return values.squeeze(1) if count is None else values
