"""Read a stable-baselines3 policy ``.zip`` as data: the actor network's weights and the spaces, no code run.

An SB3 file is a zip holding ``policy.pth`` (the network's state dict, a torch pickle), ``data`` (JSON whose
non-JSON values — the spaces, the policy class, schedules — are base64 cloudpickle blobs) and a few text members.
``PPO.load`` unpickles all of it, so loading a stranger's file runs whatever code it carries. Here:

- ``policy.pth`` is read with ``torch.load(weights_only=True)``: tensors only, any other object is refused;
- the spaces come from the readable fields SB3 writes beside each blob (``_shape``, ``low``, ``high``, ``n``);
  the blobs themselves are never unpickled, only disassembled (``pickletools``, which executes nothing) to
  refuse files whose blobs would import anything beyond what SB3 itself writes;
- the actor (MlpExtractor policy branch + action head) is rebuilt from the state dict's shapes and the activation
  named in ``policy_kwargs``.

A full ``PPO.load`` happens only with ``trust_pickle=True`` (``policy.trust_pickle=true``), for files one trusts.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
import pickletools
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spectune import names
from spectune.errors import SpectuneError
from spectune.io import json_text, write_atomic

log = logging.getLogger(__name__)

MAX_MEMBER_BYTES = 256 * 2**20  # a policy network far larger than any draft-length policy needs
ACTIVATIONS: dict[str, type[torch.nn.Module]] = {
    cls.__name__: cls for cls in (torch.nn.Tanh, torch.nn.ReLU, torch.nn.ELU, torch.nn.LeakyReLU, torch.nn.SiLU,
                                  torch.nn.GELU, torch.nn.Sigmoid, torch.nn.Identity)
}
# Globals the blobs SB3 writes for an MlpPolicy on Box/Discrete spaces import (read from SB3 2.x files).
SAFE_GLOBALS: set[tuple[str, str]] = {
    ("stable_baselines3.common.policies", "ActorCriticPolicy"),
    ("stable_baselines3.common.policies", "MultiInputActorCriticPolicy"),
    ("stable_baselines3.common.buffers", "RolloutBuffer"),
    ("stable_baselines3.common.buffers", "DictRolloutBuffer"),
    ("stable_baselines3.common.utils", "FloatSchedule"),
    ("stable_baselines3.common.utils", "ConstantSchedule"),
    ("stable_baselines3.common.utils", "LinearSchedule"),
    ("gymnasium.spaces.box", "Box"),
    ("gymnasium.spaces.discrete", "Discrete"),
    ("gymnasium.spaces.multi_discrete", "MultiDiscrete"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("numpy.random.bit_generator", "SeedSequence"),
    ("builtins", "dict"),
    ("builtins", "list"),
    ("builtins", "tuple"),
    ("builtins", "float"),
    ("builtins", "int"),
    ("collections", "OrderedDict"),
    ("collections", "deque"),
    *(("torch.nn.modules.activation", name) for name in ACTIVATIONS),
    ("torch.nn.modules.linear", "Identity"),
}
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
               "SHORT_BINSTRING"}


@dataclass(frozen=True)
class BoxSpace:
    """A 1-D ``gymnasium.spaces.Box`` as SB3 recorded it."""

    shape: tuple[int, ...]
    low: np.ndarray
    high: np.ndarray
    dtype: str


@dataclass(frozen=True)
class DiscreteSpace:
    """A ``gymnasium.spaces.Discrete``: actions start..start+n-1."""

    n: int
    start: int = 0


@dataclass
class PolicyFile:
    """What spectune uses of an SB3 policy file: its spaces and an actor network mapping observations to logits."""

    path: Path
    observation_space: BoxSpace
    action_space: DiscreteSpace
    actor: torch.nn.Sequential
    sb3_version: str
    hidden: list[int]
    activation: str
    extra: dict[str, Any] = field(default_factory=dict)  # spectune.json inside the zip, if present
    trusted: bool = False

    @torch.no_grad()
    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, n_obs] observations (SB3 feeds Box observations as float32, unscaled) -> [B, n] action logits."""
        return self.actor(obs.to(torch.float32))

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "sb3_version": self.sb3_version, "observation_shape": list(
            self.observation_space.shape), "actions": self.action_space.n, "hidden": self.hidden,
            "activation": self.activation, "trusted_pickle": self.trusted, **({"spectune": self.extra}
                                                                              if self.extra else {})}


def _refuse(key: str, path: Path, why: str) -> SpectuneError:
    return SpectuneError(f"{key}={str(path)!r} is refused: {why}")


def pickle_globals(blob: bytes) -> list[tuple[str, str] | None]:
    """The (module, name) of every global a pickle would import, found by disassembly (nothing is executed).

    ``None`` marks a global whose name this reader cannot resolve statically (treated as unsafe)."""
    found: list[tuple[str, str] | None] = []
    pushed: list[Any] = []  # recent pushes: strings, or None for anything else
    memo: dict[int, Any] = {}
    for op, arg, _ in pickletools.genops(blob):
        name = op.name
        if name in _STRING_OPS:
            pushed.append(arg)
        elif name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            found.append((module, attr))
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            module, attr = (pushed[-2], pushed[-1]) if len(pushed) >= 2 else (None, None)
            found.append((module, attr) if isinstance(module, str) and isinstance(attr, str) else None)
            pushed.append(None)
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = pushed[-1] if pushed else None
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo.get(int(arg)))
        elif name not in ("FRAME", "PROTO", "STOP", "MARK", "POP", "POP_MARK"):
            pushed.append(None)
    return found


def _blobs(obj: Any, where: str = "") -> list[tuple[str, str]]:
    """Every ``:serialized:`` blob in SB3's ``data`` JSON, with the entry it belongs to."""
    if isinstance(obj, dict):
        out = [(where or "/", obj[":serialized:"])] if isinstance(obj.get(":serialized:"), str) else []
        for key, value in obj.items():
            if key != ":serialized:":
                out.extend(_blobs(value, f"{where}/{key}"))
        return out
    if isinstance(obj, list):
        return [b for i, value in enumerate(obj) for b in _blobs(value, f"{where}/{i}")]
    return []


def _numbers(text: Any, size: int, what: str) -> np.ndarray:
    """Parse numpy's printed 1-D array (``[-4.8 -inf 0.5]``) or a scalar repr into ``size`` floats."""
    if isinstance(text, int | float):
        return np.full(size, float(text))
    if not isinstance(text, str) or "..." in text:
        raise ValueError(f"{what} is not a readable array")
    tokens = re.sub(r"[\[\],]", " ", text).split()
    values = np.array([float(t) for t in tokens], dtype=np.float64)
    if values.size == 1:
        values = np.full(size, values[0])
    if values.size != size:
        raise ValueError(f"{what} has {values.size} values for shape ({size},)")
    return values


def _box(entry: Any) -> BoxSpace:
    if not isinstance(entry, dict) or entry.get(":type:") != "<class 'gymnasium.spaces.box.Box'>":
        raise ValueError(f"observation space is {entry.get(':type:') if isinstance(entry, dict) else entry!r}, "
                         "not a gymnasium Box")
    shape = tuple(int(s) for s in entry["_shape"])
    if len(shape) != 1:
        raise ValueError(f"observation shape {shape} is not 1-D")
    return BoxSpace(shape, _numbers(entry.get("low"), shape[0], "low"), _numbers(entry.get("high"), shape[0], "high"),
                    str(entry.get("dtype", "float32")))


def _discrete(entry: Any) -> DiscreteSpace:
    if not isinstance(entry, dict) or entry.get(":type:") != "<class 'gymnasium.spaces.discrete.Discrete'>":
        raise ValueError(f"action space is {entry.get(':type:') if isinstance(entry, dict) else entry!r}, "
                         "not a gymnasium Discrete")
    return DiscreteSpace(int(entry["n"]), int(entry.get("start", 0)))


def _activation(policy_kwargs: Any) -> str:
    text = policy_kwargs.get("activation_fn") if isinstance(policy_kwargs, dict) else None
    if text is None:
        return "Tanh"  # ActorCriticPolicy's default
    match = re.fullmatch(r"<class 'torch\.nn\.modules\.(?:activation|linear)\.(\w+)'>", str(text))
    if not match or match.group(1) not in ACTIVATIONS:
        raise ValueError(f"activation_fn {text} is not one of {', '.join(ACTIVATIONS)}")
    return match.group(1)


def _actor(state: dict[str, torch.Tensor], activation: str) -> tuple[torch.nn.Sequential, list[int]]:
    """Rebuild mlp_extractor.policy_net (+ action_net) from the state dict; other parameters must be the critic's."""
    allowed = re.compile(r"(mlp_extractor\.(policy_net|value_net)\.\d+|action_net|value_net)\.(weight|bias)")
    strange = [k for k in state if not allowed.fullmatch(k)]
    if strange:
        raise ValueError(f"parameters {strange[:3]} are not an MlpPolicy's (only MLP actor-critic files are read)")
    indices = sorted({int(k.split(".")[2]) for k in state if k.startswith("mlp_extractor.policy_net.")})
    layers: list[torch.nn.Module] = []
    hidden: list[int] = []
    for index in indices:
        prefix = f"mlp_extractor.policy_net.{index}"
        weight, bias = state[f"{prefix}.weight"], state[f"{prefix}.bias"]
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
        linear.load_state_dict({"weight": weight, "bias": bias})
        layers += [linear, ACTIVATIONS[activation]()]
        hidden.append(weight.shape[0])
    head = torch.nn.Linear(state["action_net.weight"].shape[1], state["action_net.weight"].shape[0])
    head.load_state_dict({"weight": state["action_net.weight"], "bias": state["action_net.bias"]})
    layers.append(head)
    actor = torch.nn.Sequential(*layers).float().eval()
    for param in actor.parameters():
        param.requires_grad_(False)
    return actor, hidden


def read_policy_file(path: str | Path, key: str = "policy.gamma_path", trust_pickle: bool = False) -> PolicyFile:
    """Read an SB3 PPO ``.zip`` without running code from it (see the module); ``key`` names the config value
    in error messages. With ``trust_pickle`` the file is loaded by SB3 itself (its pickles run)."""
    path = Path(path)
    if not path.is_file():
        raise SpectuneError(f"{key}={str(path)!r} is invalid: no such file (a policy .zip written by "
                            "stable-baselines3, e.g. by python -m policies.train)")
    if trust_pickle:
        return _trusted(path, key)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise SpectuneError(f"{key}={str(path)!r} is invalid: not a zip file ({err})") from None
    with archive:
        members = {info.filename: info for info in archive.infolist()}
        for needed in ("data", "policy.pth"):
            if needed not in members:
                raise SpectuneError(f"{key}={str(path)!r} is invalid: no {needed!r} member (not an SB3 policy file)")
            if members[needed].file_size > MAX_MEMBER_BYTES:
                raise _refuse(key, path, f"member {needed!r} is {members[needed].file_size} bytes")
        try:
            data = json.loads(archive.read("data"))
        except (ValueError, UnicodeDecodeError) as err:
            raise SpectuneError(f"{key}={str(path)!r} is invalid: its 'data' member is not JSON ({err})") from None
        for where, blob in _blobs(data):
            try:
                imports = pickle_globals(base64.b64decode(blob, validate=True))
            except (binascii.Error, ValueError) as err:
                raise _refuse(key, path, f"entry {where!r} is not a readable pickle ({err})") from None
            unsafe = [g for g in imports if g not in SAFE_GLOBALS]
            if unsafe:
                what = ".".join(unsafe[0]) if unsafe[0] else "a global it hides"
                raise _refuse(key, path, f"entry {where!r} would import {what} when unpickled (spectune never "
                              "unpickles it; set policy.trust_pickle=true only for a file whose source you trust)")
        try:
            state = torch.load(io.BytesIO(archive.read("policy.pth")), map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises UnpicklingError or RuntimeError variants
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise _refuse(key, path, f"policy.pth holds more than tensors ({first[:200]})") from None
        version = archive.read("_stable_baselines3_version").decode("utf-8", "replace").strip() \
            if "_stable_baselines3_version" in members else "unknown"
        extra = json.loads(archive.read("spectune.json")) if "spectune.json" in members else {}
    extra = names.upgrade(extra)  # a file written before the draft length was named γ everywhere: the new names
    try:
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError("policy.pth is not a state dict of tensors")
        observation, action = _box(data.get("observation_space")), _discrete(data.get("action_space"))
        activation = _activation(data.get("policy_kwargs"))
        actor, hidden = _actor(state, activation)
        first = actor[0]
        if first.in_features != observation.shape[0] or actor[-1].out_features != action.n:
            raise ValueError(f"network maps {first.in_features} inputs to {actor[-1].out_features} actions, the "
                             f"spaces say {observation.shape[0]} and {action.n}")
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise SpectuneError(f"{key}={str(path)!r} is invalid: {err}") from None
    log.info("read %s: SB3 %s, observation %s, %d actions, actor %s (%s), no code run", path, version,
             observation.shape, action.n, hidden, activation)
    return PolicyFile(path, observation, action, actor, version, hidden, activation, extra)


def _trusted(path: Path, key: str) -> PolicyFile:
    """SB3's own load (runs the file's pickles): only on ``policy.trust_pickle=true``."""
    from stable_baselines3 import PPO

    log.warning("loading %s with stable-baselines3 (policy.trust_pickle=true): its pickled objects run", path)
    try:
        model = PPO.load(path, device="cpu")
    except Exception as err:  # whatever SB3 raises on a bad file
        raise SpectuneError(f"{key}={str(path)!r} is invalid: stable-baselines3 cannot load it ({err})") from None
    obs_space, act_space = model.observation_space, model.action_space
    if not (hasattr(obs_space, "low") and len(obs_space.shape) == 1 and hasattr(act_space, "n")):
        raise SpectuneError(f"{key}={str(path)!r} is invalid: spaces {obs_space} / {act_space} are not a 1-D Box "
                            "and a Discrete")
    policy = model.policy
    actor = torch.nn.Sequential(*policy.mlp_extractor.policy_net, policy.action_net).float().eval()
    hidden = [m.out_features for m in policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)]
    activation = next((type(m).__name__ for m in policy.mlp_extractor.policy_net
                       if not isinstance(m, torch.nn.Linear)), "Tanh")
    with zipfile.ZipFile(path) as archive:
        extra = json.loads(archive.read("spectune.json")) if "spectune.json" in archive.namelist() else {}
    extra = names.upgrade(extra)
    box = BoxSpace(tuple(obs_space.shape), np.asarray(obs_space.low, np.float64), np.asarray(obs_space.high,
                   np.float64), str(obs_space.dtype))
    return PolicyFile(path, box, DiscreteSpace(int(act_space.n), int(getattr(act_space, "start", 0))), actor,
                      "trusted", hidden, activation, extra, trusted=True)


def annotate_policy_file(path: str | Path, extra: dict[str, Any]) -> Path:
    """Add (or replace) the ``spectune.json`` member of an SB3 ``.zip``: the observation's feature names,
    divisors, actions and the profile the policy was trained for. SB3 ignores members it does not know."""
    path = Path(path)
    with zipfile.ZipFile(path) as source:
        members = [(info, source.read(info.filename)) for info in source.infolist() if info.filename != "spectune.json"]

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as target:
            for info, payload in members:
                target.writestr(info, payload)
            target.writestr("spectune.json", json_text(extra, sort_keys=True))

    return write_atomic(path, write)
