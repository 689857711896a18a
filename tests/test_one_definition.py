"""One definition each, checked where its two sources meet: the γ observation has one builder
(``policies.envs.observation.GAMMA``), fed by a trace row in the environment and by the engine's draft step in
``policy=ppo``; from the same recorded step the two give the same vector, bit for bit. And the replay driver shows
a policy the same draft steps, and takes the same decisions, as the live session.

Tiny random pair (tests/tiny_models.py), T = 1 with keyed streams, seed 5, concurrency 2, 3 requests × 14 tokens,
γ 4: every recorded cycle is replayed; exact equality, no tolerance.

And in the source: a method label is built in one module (``spectune.methods``), the baseline's label spelled
and a fixed γ's label recognised there only, one function checks a γ value (``spectune.options.check_gamma``), and
the built prompt categories are listed once (``workloads.categories.CATEGORIES``).
"""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO

from policies.envs.data import TraceSet
from policies.envs.gamma import DRAFT, DraftGammaEnv
from policies.envs.observation import OBS_FIELDS
from policies.envs.replay import replay_gammas
from policies.sb3_files import annotate_policy_file
from spectune.costmodel.profile import load_profile
from spectune.engine.policy import DRAFT_SIGNALS, FixedGamma
from tests.conftest import REPO
from tests.tiny_models import record_three_requests
from tests.watched import Watched

GAMMA, SLOTS = 4, 2
PROFILE = "tiny-cpu-2core-vm"


@pytest.fixture(scope="module")
def recorded(pair):
    """The engine, its requests, and traces of them drafted to GAMMA every cycle."""
    return record_three_requests(pair, GAMMA, SLOTS)


def _always_continue(path, traces: TraceSet) -> str:
    """A real SB3 γ policy file whose actor says "continue" whatever it sees (its last layer: bias only), so
    that in the engine it drafts to the ceiling every cycle: the recorded cycles, step for step."""
    env = DraftGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [8]})
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.copy_(torch.tensor([-5.0, 5.0]))
    model.save(path)
    annotate_policy_file(path, {"observation": list(OBS_FIELDS), "actions": ["stop", "continue"],
                                "profile": load_profile(PROFILE).to_json(), "max_gamma": GAMMA})
    return str(path)




def test_the_live_and_the_replay_builder_give_the_same_vector_from_the_same_recorded_step(recorded, tmp_path):
    """The live source (the engine's DraftStep, the policy's history) and the replay source (the trace row in
    spectune/DraftGamma-v0) feed the one builder; every recorded (cycle, row, step) compared bytes to bytes."""
    engine, requests, traces, outputs = recorded
    path = _always_continue(tmp_path / "gamma.zip", traces)
    policy = Watched(GAMMA, path, False, None, False, True, 0)
    live = engine.run(requests, policy, SLOTS)
    assert {c.num_drafts for c in live.cycles} == {GAMMA}  # drafted to the ceiling, as the recording
    assert {r.request_id: r.output_ids for r in live.requests} == outputs  # the same cycles, the same tokens
    env = DraftGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True)
    entry = {(int(c), int(r)): i for i, (c, r) in enumerate(zip(traces.cycle, traces.row, strict=True))}
    compared = steps = 0
    for cycle, step, obs in policy.seen:
        for row in range(obs.shape[0]):
            if (cycle, row) not in entry or not obs[row].any():  # an idle slot
                continue
            env_obs, _ = env.reset(options={"entry": entry[(cycle, row)]})
            for _ in range(step + 1):  # step -1 is begin_cycle's (nothing drafted yet)
                env_obs, *_ = env.step(DRAFT)
            assert env_obs.dtype == obs.dtype == np.float32
            assert env_obs.tobytes() == obs[row].tobytes(), (cycle, step, row, env_obs, obs[row])
            compared += 1
            steps |= 1 << (step + 1)
    # every recorded (cycle, row) at steps 0..GAMMA-2 (no decision after the last draft), and begin_cycle's
    assert compared >= traces.count * (GAMMA - 1) and steps == sum(1 << s for s in range(GAMMA))


class ShownSteps(FixedGamma):
    """A fixed γ that reads every signal and keeps what it is shown after each draft step, on the busy slots
    (an idle slot's values are undefined live and 0 in the replay; no policy reads them)."""

    signals = frozenset(DRAFT_SIGNALS)

    def reset(self) -> None:
        self.shown = []

    def continue_drafting(self, step):
        busy = step.context_length > 0
        self.shown.append((step.step, busy.tolist(), step.active[busy].tolist(), step.context_length[busy].tolist(),
                           [getattr(step, name)[busy].double().tolist() for name in DRAFT_SIGNALS]))
        return None


@pytest.mark.parametrize("gamma", [2, 3, GAMMA])
def test_a_fixed_gamma_replayed_sees_and_decides_what_the_live_session_did(recorded, gamma):
    """Live at γ = k against the replay of the γ = GAMMA recording: the same draft steps shown (step, rows
    drafting, context lengths, signals) and the same drafts per cycle and row. At k = GAMMA the live run is the
    recording, cycle for cycle; below it the live session goes on from other contexts after its first cycle, so
    only that one is compared."""
    engine, requests, traces, _ = recorded
    live_policy, replayed_policy = ShownSteps(gamma), ShownSteps(gamma)
    live = engine.run(requests, live_policy, SLOTS)
    replayed = replay_gammas(replayed_policy, traces, GAMMA, load_profile(PROFILE))
    assert (replayed == gamma).all() and {c.num_drafts for c in live.cycles} == {gamma}
    assert len(replayed_policy.shown) == len(traces.cycle_slices) * (gamma - 1)
    if gamma == GAMMA:
        assert [c.num_drafts for c in live.cycles] == replayed.tolist()
        assert live_policy.shown == replayed_policy.shown
    else:
        assert live_policy.shown[: gamma - 1] == replayed_policy.shown[: gamma - 1]


def test_scale_rows_is_scale_gamma_on_python_numbers_bit_for_bit():
    """The engine-side builder and the environments' scaling, on 200 random rows of every field (seed 3): equal
    bit for bit, including values that do not round-trip through float32 exactly."""
    from policies.envs.observation import OBS_FIELDS, scale_gamma, scale_rows, scales

    raw = np.random.default_rng(3).uniform(0, 2000, (200, len(OBS_FIELDS)))
    raw[:, OBS_FIELDS.index("context_length")] = np.floor(raw[:, OBS_FIELDS.index("context_length")])
    fast = scale_rows([raw[:, i].tolist() for i in range(len(OBS_FIELDS))], scales(OBS_FIELDS).tolist())
    assert fast.dtype == np.float32 and np.array_equal(fast, scale_gamma(raw))


SOURCE = ("spectune", "workloads", "policies", "analysis", "harness", "hydra_plugins", "bench")


def _trees() -> dict[str, ast.Module]:
    """Every module of the library and applications by dotted name; a committed result's script (bench/results/)
    is a record of what ran, not code to keep in step."""
    out = {}
    for package in SOURCE:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO)
            if rel.parts[:2] != ("bench", "results"):
                out[".".join(rel.with_suffix("").parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def _strings(tree: ast.Module) -> list[tuple[int, str, bool]]:
    """(line, text, built) of every string constant; ``built``: a constant piece of an f-string."""
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return [(node.lineno, node.value, id(node) in pieces) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_a_method_label_is_built_only_in_spectune_methods():
    """An f-string with ``:gamma=`` in it, or a string that ends in it (``"fixed:gamma=" + str(g)``), builds a
    label; only spectune/methods.py may (docstrings and messages that quote a whole label are neither)."""
    built = [f"{module}:{line}: {text!r}" for module, tree in _trees().items() if module != "spectune.methods"
             for line, text, piece in _strings(tree)
             if (piece and ":gamma=" in text) or text.rstrip().endswith(":gamma=")]
    assert not built, "build a spectune.methods.Method and take .label:\n" + "\n".join(built)


def test_the_baseline_label_is_spelled_only_in_spectune_methods():
    """The literal "ar" is spectune.methods.BASELINE everywhere else (a committed result's script is a record)."""
    spelled = [f"{module}:{line}" for module, tree in _trees().items() if module != "spectune.methods"
               for line, text, _ in _strings(tree) if text == "ar"]
    assert not spelled, "use spectune.methods.BASELINE (or AR):\n" + "\n".join(spelled)


def test_a_fixed_gamma_is_recognised_only_by_spectune_methods():
    """A string that starts ``fixed:`` (``label.startswith("fixed:")``) reads a label by hand; elsewhere a label is
    asked ``spectune.methods.is_fixed_label`` or parsed (``Method.parse(label).is_fixed``)."""
    read = [f"{module}:{line}: {text!r}" for module, tree in _trees().items() if module != "spectune.methods"
            for line, text, _ in _strings(tree) if text.startswith("fixed:")]
    assert not read, "use spectune.methods.is_fixed_label (or Method.is_fixed):\n" + "\n".join(read)


def test_one_function_checks_a_gamma_value():
    """``def check_gamma`` once, in spectune.options; what fits a context or a replay has a name of its own."""
    defined = [module for module, tree in _trees().items() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "check_gamma"]
    assert defined == ["spectune.options"], defined


def test_the_prompt_categories_are_listed_once():
    """The six built categories, as a literal of all six names, only in workloads.categories; everything else
    imports ``CATEGORIES``."""
    from workloads.categories import CATEGORIES

    listed = [f"{module}:{node.lineno}" for module, tree in _trees().items() for node in ast.walk(tree)
              if isinstance(node, ast.Tuple | ast.List | ast.Set)
              and set(CATEGORIES) <= {e.value for e in node.elts if isinstance(e, ast.Constant)}]
    assert listed == [f"workloads.categories:{_line_of('CATEGORIES = (')}"], listed


def _line_of(start: str) -> int:
    lines = (REPO / "workloads" / "categories.py").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith(start))
