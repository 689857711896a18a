"""Hardware cost profiles: what a draft step, a verification and a cycle's overhead cost on one setup.

A profile (``profile.json``, written by ``task=profile`` or shipped in ``spectune/costmodel/profiles/``) lets a
replay environment charge a cycle what it would cost on that hardware, without the hardware. Schema:

    {"kind": "spectune-profile", "version": 1, "label", "synthetic", "notes": [...], "models": {...},
     "hardware": {...}, "batch_sizes": [1, 2, ...], "max_positions": max_gamma + 1,
     "t_draft_s": {"<b>": s}, "t_verify_s": {"<b>": [s at n = 1..max_positions]},
     "overhead_s": {"<b>": s}, "interpolated": {"<b>": bool}, "fit": {...}, "metadata": {...},
     "t_first_draft_s": {"<b>": s}  (optional)}

A cycle's first draft step costs more than the others: it also feeds the draft what the last cycle emitted and the
draft has not seen (the corrected or bonus token, and the last accepted draft), and it starts the cycle on cold
caches (measured: 1.10–1.20 ms against 0.86–0.96 ms on the tiny pair, 5.6–6.1 ms against 4.9–5.5 ms on smollm2).
``t_first_draft_s`` keeps it apart, so a cycle of γ drafts costs t_first_draft + (γ − 1)·t_draft; a profile without
it (older files, synthetic ones) charges every step t_draft.

One convention everywhere (the cost model's units): c(b) = t_draft(b) / t_verify(b, 1) (a later draft step),
c₁(b) = t_first_draft(b) / t_verify(b, 1),
g(γ, b) = t_verify(b, γ+1) / t_verify(b, 1) (γ+1 positions over one; n = 1 is the autoregressive step),
o(b) = overhead(b) / t_verify(b, 1). A batch size between measured ones is interpolated linearly; beyond
them the nearest is used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from spectune import names
from spectune.costmodel.cycle import CycleCost
from spectune.errors import SpectuneError
from spectune.placement import cpu_model
from spectune.run.rundir import current_model_path

KIND, VERSION = "spectune-profile", 1
# Fields that must agree between a profile and the run it is applied to (dotted paths in models/hardware).
MATCH_FIELDS = ("models.target.name_or_path", "models.draft.name_or_path", "hardware.device",
                "hardware.device_name", "hardware.dtype", "hardware.execution_path", "hardware.cpu_bf16")
# Recorded only since profiles carried them: compared where both sides have them. Two VMs that both call
# themselves "AMD EPYC" differ in whether bfloat16 runs in hardware, and with it in every bfloat16 cost.
# A run with a model-free draft loads no draft model and names none (profiles measured before that name the pair's).
WHERE_RECORDED = ("hardware.cpu_bf16", "models.draft.name_or_path")


@dataclass(frozen=True)
class CycleCosts(CycleCost):
    """What one batch shape costs (seconds): a draft step, the verification of n = 1..max_positions positions and
    the per-cycle overhead; a cycle's cost is :class:`~spectune.costmodel.cycle.CycleCost`'s sum of them. A profile
    gives one per batch size (:meth:`Profile.costs`); the model-based policy builds one from the costs it measures.
    Replays, environments and the profile itself charge through :meth:`cycle_s`."""

    t_draft: float
    t_verify: np.ndarray  # [max_positions]: n = 1, 2, ...
    overhead: float
    t_first_draft: float | None = None  # a cycle's first draft step; None: t_draft

    @property
    def first_draft(self) -> float:
        return self.t_draft if self.t_first_draft is None else self.t_first_draft

    def draft(self, drafted: Any) -> Any:
        """Seconds of ``drafted`` draft steps in one cycle (an int or an array of them): the first step, then
        t_draft each."""
        return drafted * self.t_draft + (self.first_draft - self.t_draft) * (np.asarray(drafted) > 0)

    def verify(self, drafts: Any) -> Any:
        """Seconds of the verification of ``drafts`` drafts (``drafts`` + 1 positions; an int or an array)."""
        return self.t_verify[drafts]

    # The interface's terms named in their unit, as every replay and environment charges with them.
    draft_s = draft
    cycle_s = CycleCost.cycle
    ar_s = CycleCost.ar

    @property
    def c(self) -> float:
        """A (later) draft step over an autoregressive step, c(b)."""
        return self.t_draft / self.t_verify[0]

    @property
    def c_first(self) -> float:
        """A cycle's first draft step over an autoregressive step, c₁(b)."""
        return self.first_draft / self.t_verify[0]

    def g(self, drafts: int) -> float:
        """Verification of ``drafts`` + 1 positions over one, g(drafts, b)."""
        return self.t_verify[drafts] / self.t_verify[0]


@dataclass
class Profile:
    label: str
    batch_sizes: list[int]
    max_positions: int
    t_draft_s: dict[int, float]
    t_verify_s: dict[int, list[float]]
    overhead_s: dict[int, float]
    synthetic: bool = False
    notes: list[str] = field(default_factory=list)
    models: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    interpolated: dict[int, bool] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    t_first_draft_s: dict[int, float] | None = None  # a cycle's first draft step; None: t_draft_s

    # -- costs at any batch size ------------------------------------------------------------------------
    def _at(self, table: dict[int, Any], batch: int) -> np.ndarray:
        sizes = self.batch_sizes
        if batch <= sizes[0]:
            return np.asarray(table[sizes[0]], dtype=float)
        if batch >= sizes[-1]:
            return np.asarray(table[sizes[-1]], dtype=float)
        hi = next(i for i, b in enumerate(sizes) if b >= batch)
        b0, b1 = sizes[hi - 1], sizes[hi]
        w = (batch - b0) / (b1 - b0)
        return (1 - w) * np.asarray(table[b0], dtype=float) + w * np.asarray(table[b1], dtype=float)

    def t_draft(self, batch: int) -> float:
        return float(self._at(self.t_draft_s, batch))

    def t_first_draft(self, batch: int) -> float:
        return float(self._at(self.t_first_draft_s or self.t_draft_s, batch))

    def t_verify(self, batch: int, positions: int) -> float:
        """Target forward of ``positions`` (1..max_positions) tokens per row at ``batch`` rows."""
        if not 1 <= positions <= self.max_positions:
            raise SpectuneError(f"positions={positions} is out of range: profile {self.label!r} covers "
                                f"1..{self.max_positions}")
        return float(self._at(self.t_verify_s, batch)[positions - 1])

    def verify_times(self, batch: int) -> np.ndarray:
        """t_verify at ``batch`` rows for n = 1..max_positions ([max_positions] seconds)."""
        return self._at(self.t_verify_s, batch)

    def overhead(self, batch: int) -> float:
        return float(self._at(self.overhead_s, batch))

    def c(self, batch: int) -> float:
        return self.t_draft(batch) / self.t_verify(batch, 1)

    def c_first(self, batch: int) -> float:
        return self.t_first_draft(batch) / self.t_verify(batch, 1)

    def g(self, gamma: int, batch: int) -> float:
        return self.t_verify(batch, gamma + 1) / self.t_verify(batch, 1)

    def o(self, batch: int) -> float:
        return self.overhead(batch) / self.t_verify(batch, 1)

    def costs(self, batch: int) -> CycleCosts:
        """The costs of a cycle at ``batch`` rows."""
        return CycleCosts(self.t_draft(batch), self.verify_times(batch), self.overhead(batch),
                          self.t_first_draft(batch))

    def cycle_s(self, gamma: int, batch: int) -> float:
        """A whole cycle at ``batch`` rows: ``gamma`` draft steps, verification of γ+1 positions, the overhead."""
        if not 0 <= gamma < self.max_positions:
            raise SpectuneError(f"gamma={gamma} is out of range: profile {self.label!r} covers "
                                f"0..{self.max_positions - 1}")
        return float(self.costs(batch).cycle_s(gamma))

    def scaled(self, draft: float = 1.0, verify_slope: float = 1.0, overhead: float = 1.0, ar_step: float = 1.0,
               label: str | None = None) -> Profile:
        """A synthetic neighbour: draft steps (the first included) × ``draft``, the verification's per-position slope
        × ``verify_slope``, its first position (the AR step) × ``ar_step``, overhead × ``overhead``. Used to sample
        hardware per training episode, and by :func:`policies.train.calibrate.calibrate_profile` (which keeps the
        source's notes, fit and metadata on top)."""
        return replace(
            self, label=label or f"{self.label} (scaled)", batch_sizes=list(self.batch_sizes),
            t_draft_s={b: t * draft for b, t in self.t_draft_s.items()},
            t_verify_s={b: [ar_step * v[0] + verify_slope * (x - v[0]) for x in v] for b, v in self.t_verify_s.items()},
            overhead_s={b: t * overhead for b, t in self.overhead_s.items()}, synthetic=True,
            notes=[*self.notes, f"scaled: draft x{draft:g}, verify slope x{verify_slope:g}, AR step x{ar_step:g}, "
                                f"overhead x{overhead:g}"],
            interpolated=dict(self.interpolated), fit={}, metadata={},
            t_first_draft_s={b: t * draft for b, t in self.t_first_draft_s.items()} if self.t_first_draft_s else None)

    # -- (de)serialisation --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def keyed(table: dict[int, Any]) -> dict[str, Any]:
            return {str(b): table[b] for b in self.batch_sizes}

        data = {"kind": KIND, "version": VERSION, "label": self.label, "synthetic": self.synthetic,
                "notes": self.notes, "models": self.models, "hardware": self.hardware,
                "batch_sizes": self.batch_sizes, "max_positions": self.max_positions,
                "t_draft_s": keyed(self.t_draft_s), "t_verify_s": keyed(self.t_verify_s),
                "overhead_s": keyed(self.overhead_s),
                "interpolated": {str(b): bool(self.interpolated.get(b, False)) for b in self.batch_sizes},
                "fit": self.fit, "metadata": self.metadata}
        if self.t_first_draft_s:
            data["t_first_draft_s"] = keyed(self.t_first_draft_s)
        return data

    @classmethod
    def from_json(cls, data: Any, source: str = "profile") -> Profile:
        data = names.upgrade(data)  # a profile written before the draft length was named γ everywhere
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise SpectuneError(f"profile={source} is invalid: not a spectune profile (kind must be {KIND!r})")
        if data.get("version") != VERSION:
            raise SpectuneError(f"profile={source} is invalid: version {data.get('version')!r}, expected {VERSION}")
        try:
            sizes = sorted(int(b) for b in data["batch_sizes"])
            positions = int(data["max_positions"])
            draft = {b: float(data["t_draft_s"][str(b)]) for b in sizes}
            verify = {b: [float(x) for x in data["t_verify_s"][str(b)]] for b in sizes}
            overhead = {b: float(data["overhead_s"][str(b)]) for b in sizes}
            first = {b: float(data["t_first_draft_s"][str(b)]) for b in sizes} if "t_first_draft_s" in data else None
        except (KeyError, TypeError, ValueError) as err:
            raise SpectuneError(f"profile={source} is invalid: missing or malformed field ({err})") from None
        values = [*draft.values(), *overhead.values(), *(x for v in verify.values() for x in v),
                  *(first or {}).values()]
        if not sizes or positions < 1 or any(len(v) != positions for v in verify.values()) \
                or not all(math.isfinite(x) and x >= 0 for x in values) or min(v[0] for v in verify.values()) <= 0:
            raise SpectuneError(f"profile={source} is invalid: needs batch sizes, max_positions >= 1, "
                                "max_positions finite non-negative verify times per batch (AR step > 0)")
        return cls(str(data.get("label", source)), sizes, positions, draft, verify, overhead,
                   bool(data.get("synthetic", False)), list(data.get("notes", [])), dict(data.get("models", {})),
                   dict(data.get("hardware", {})), {int(b): bool(v) for b, v in data.get("interpolated", {}).items()},
                   dict(data.get("fit", {})), dict(data.get("metadata", {})), first)


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with spectune (``spectune/costmodel/profiles/<name>.json``)."""
    return sorted(p.name.removesuffix(".json") for p in resources.files("spectune.costmodel.profiles").iterdir()
                  if p.name.endswith(".json"))


def load_profile(path_or_name: str | Path) -> Profile:
    """A profile from a file, or a shipped one by name (e.g. ``h200-llama3-8b-1b``)."""
    path = Path(path_or_name)
    if not path.is_file():
        name = str(path_or_name)
        if name in shipped_profiles():
            path = Path(str(resources.files("spectune.costmodel.profiles").joinpath(f"{name}.json")))
        else:
            raise SpectuneError(f"profile={name!r} is not found: give a profile.json path or one of "
                                f"{', '.join(shipped_profiles())}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise SpectuneError(f"profile={path} is invalid: cannot read it as JSON ({err})") from None
    return Profile.from_json(data, str(path))


def device_name(device: Any) -> str:
    """What the profile match compares as the device: the GPU's name, or the CPU's processor string."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_model()


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    if dotted == "hardware.device" and isinstance(node, str):
        return node.split(":")[0]  # cuda:0 and cuda are the same kind of device
    return current_model_path(node) if dotted.endswith("name_or_path") else node


def profile_mismatch(profile: Profile, run: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Fields of :data:`MATCH_FIELDS` where the profile and the run (``{"models":…, "hardware":…}``) differ."""
    mine = {"models": profile.models, "hardware": profile.hardware}
    pairs = {f: (_lookup(mine, f), _lookup(run, f)) for f in MATCH_FIELDS}
    bf16 = "bfloat16" in (_lookup(mine, "hardware.dtype"), _lookup(run, "hardware.dtype"))
    return {f: (a, b) for f, (a, b) in pairs.items()
            if a != b and not (f in WHERE_RECORDED and (a is None or b is None))
            and not (f == "hardware.cpu_bf16" and not bf16)}  # bfloat16 support decides only bfloat16 costs


def check_profile(profile: Profile, run: dict[str, Any], allow_mismatch: bool = False) -> str | None:
    """Refuse a profile of other models/hardware than ``run``'s unless ``allow_mismatch``.

    Returns None when they match, else the synthetic label results made this way must carry
    (e.g. "tiny acceptance x H200 costs").
    """
    diff = profile_mismatch(profile, run)
    if not diff:
        return None
    text = "; ".join(f"{k}: profile {a!r} vs run {b!r}" for k, a, b in ((k, *v) for k, v in diff.items()))
    if not allow_mismatch:
        raise SpectuneError(f"profile={profile.label!r} is for other models or hardware ({text}): use a profile "
                            "measured on this setup (task=profile) or set allow_profile_mismatch=true (results are "
                            "then labelled synthetic)")
    source = (run.get("models") or {}).get("name") or _lookup(run, "models.target.name_or_path")
    return f"synthetic: {source} acceptance x {profile.label} costs"


def fit_linear(positions: list[int], seconds: list[float]) -> dict[str, float]:
    """Least-squares t ≈ a + b·n with the largest relative residual |t − fit| / t."""
    n, t = np.asarray(positions, dtype=float), np.asarray(seconds, dtype=float)
    if len(n) < 2:
        return {"a": float(t[0]), "b": 0.0, "max_rel_residual": 0.0}
    b, a = np.polyfit(n, t, 1)
    rel = np.abs(t - (a + b * n)) / np.maximum(t, 1e-12)
    return {"a": float(a), "b": float(b), "max_rel_residual": float(rel.max())}


DEARER_TOLERANCE = 0.10  # a verification counts as dearer than a longer one beyond this relative margin (noise)


def dearer_than_longer(seconds: list[float], tolerance: float = DEARER_TOLERANCE) -> list[tuple[int, int]]:
    """(n, m): verifying n positions (``seconds[n - 1]``) costs more than ``1 + tolerance`` times verifying m > n
    positions, m the cheapest longer width. A cost model assumes verification grows with n; a CPU's matrix kernels
    need not (small row counts can fall off the fast path), and then verifying γ = n − 1 drafts costs more than
    verifying m − 1."""
    found = []
    for n in range(1, len(seconds)):
        longer = seconds[n:]
        m = n + 1 + int(np.argmin(longer))
        if seconds[n - 1] > (1 + tolerance) * seconds[m - 1]:
            found.append((n, m))
    return found


def dearer_note(batch: int, seconds: list[float], tolerance: float = DEARER_TOLERANCE) -> str | None:
    """A profile note naming each verification width dearer than a longer one (None when costs grow with n)."""
    found = dearer_than_longer(seconds, tolerance)
    if not found:
        return None
    widths = "; ".join(f"n={n} {seconds[n - 1] * 1e3:.1f} ms > n={m} {seconds[m - 1] * 1e3:.1f} ms"
                       for n, m in found)
    return (f"batch {batch}: verification is not monotone in n ({widths}): verifying γ = n − 1 drafts costs more than "
            "verifying m − 1 here (the matrix kernels' speed depends on the row count); put the cheap widths in the γ "
            "grid")
