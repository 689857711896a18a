"""Policy files are data: an SB3 PPO ``.zip`` is read (weights and spaces) without running code from it, a crafted
file that would run code is refused, and the PPO γ policy runs its actor batched inside the engine."""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import pickle
import shutil
import zipfile

import gymnasium
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO

from policies.ppo import DEFAULT_OBSERVATION, observation_low_high
from policies.registry import make_policy
from policies.sb3_files import annotate_policy_file, pickle_globals, read_policy_file
from spectune.engine import Engine, Request
from spectune.engine.policy import CycleFeedback, DraftStep
from spectune.errors import SpectuneError
from spectune.io import write_json
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import perturbed, tiny_llama

FEATURES = ("token_prob", "position")


class TinyGammaEnv(gymnasium.Env):
    """A small Box observation (the named features) and Discrete(2) actions: enough to build a real PPO file."""

    def __init__(self, features: tuple[str, ...] = FEATURES, actions: int = 2) -> None:
        low, high = observation_low_high(features)
        self.observation_space = gymnasium.spaces.Box(low, high, dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(actions)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.low + self.np_random.uniform(0, 1, self.observation_space.shape).astype(
            np.float32), {}

    def step(self, action):
        self.t += 1
        obs, _ = self.reset() if self.t >= 3 else (np.full(self.observation_space.shape, 0.5, np.float32), None)
        return obs, float(action), self.t >= 3, False, {}


def _ppo(path, features=FEATURES, actions: int = 2, net_arch=(8,), **kwargs) -> PPO:
    model = PPO("MlpPolicy", TinyGammaEnv(features, actions), n_steps=16, batch_size=16, n_epochs=1, seed=0,
                device="cpu", policy_kwargs={"net_arch": list(net_arch), **kwargs})
    model.learn(16)
    model.save(path)
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppo") / "gamma.zip"
    return path, _ppo(path, activation_fn=torch.nn.ReLU, net_arch=(8, 4))


def _linear_policy(path, bias_continue: float, weight: float = 0.0, profile: dict | None = None) -> str:
    """A real SB3 file whose actor is linear in (token_prob, position): continue iff
    weight·token_prob + bias_continue > 0 (logit(continue) − logit(stop))."""
    model = _ppo(path, net_arch=())
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.zero_()
        model.policy.action_net.weight[1, 0] = weight
        model.policy.action_net.bias[1] = bias_continue
    model.save(path)
    annotate_policy_file(path, {"observation": list(FEATURES), "actions": ["stop", "continue"],
                                **({"profile": profile} if profile else {})})
    return str(path)


class Payload:
    """Unpickling this creates ``path``: a stand-in for any code a crafted policy file could run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _rewrite(src, dst, replace: dict[str, bytes]) -> None:
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for info in a.infolist():
            b.writestr(info, replace.get(info.filename, a.read(info.filename)))


def test_actor_read_without_unpickling_matches_sb3(trained, monkeypatch):
    path, model = trained
    import cloudpickle

    def forbidden(*args, **kwargs):
        raise AssertionError("the policy file was unpickled")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(cloudpickle, "loads", forbidden)
    policy_file = read_policy_file(path)
    monkeypatch.undo()
    assert policy_file.hidden == [8, 4] and policy_file.activation == "ReLU" and policy_file.action_space.n == 2
    assert policy_file.observation_space.shape == (2,)
    np.testing.assert_array_equal(policy_file.observation_space.high, observation_low_high(FEATURES)[1])
    obs = torch.rand(64, 2) * torch.tensor([1.0, 8.0])
    with torch.no_grad():
        expected = model.policy.get_distribution(obs).distribution.logits
    assert torch.allclose(torch.log_softmax(policy_file.logits(obs), -1), expected, atol=1e-6)
    actions, _ = model.predict(obs.numpy(), deterministic=True)
    assert policy_file.logits(obs).argmax(-1).tolist() == actions.tolist()
    trusted = read_policy_file(path, trust_pickle=True)
    assert trusted.trusted and torch.allclose(trusted.logits(obs), policy_file.logits(obs))


def test_the_engine_side_actor_decides_as_sb3_predict(trained, tmp_path):
    """PPOGamma's numpy actor (ReLU, two hidden layers here) gives SB3's deterministic action on 256 random
    observations, and logits equal to float32 precision."""
    from policies.numpy_actor import numpy_layers
    from policies.ppo import PPOGamma

    source, model = trained
    path = tmp_path / "gamma.zip"
    shutil.copy(source, path)
    annotate_policy_file(path, {"observation": list(FEATURES), "actions": ["stop", "continue"]})
    policy = PPOGamma(4, str(path), False, None, False, True, 0)
    obs = (np.random.default_rng(0).uniform(0, 1, (256, 2)) * [1.0, 8.0]).astype(np.float32)
    actions, _ = model.predict(obs, deterministic=True)
    assert policy.act(obs).tolist() == (actions == 1).tolist()
    h = obs
    for weight, bias, activation in numpy_layers(read_policy_file(path).actor):
        h = h @ weight + bias
        h = activation(h) if activation is not None else h
    np.testing.assert_allclose(h, read_policy_file(path).logits(torch.from_numpy(obs)).numpy(), atol=1e-5)


@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.ReLU])
@pytest.mark.parametrize("hidden", [0, 1, 2])
def test_the_numpy_actor_gives_the_networks_logits_and_actions(activation, hidden):
    """The engine's numpy actor (no clip, numpy actions) against the torch network: 512 seeded observations,
    logits to 1e-5, the same argmax wherever the top two logits are 1e-4 apart."""
    from policies.numpy_actor import NumpyActor

    torch.manual_seed(hidden)
    sizes = [10, *[64] * hidden, 9]
    modules: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        modules += [torch.nn.Linear(a, b)] + ([activation()] if i < len(sizes) - 2 else [])
    net = torch.nn.Sequential(*modules)
    actor = NumpyActor(net)
    obs = np.random.default_rng(0).uniform(0, 4, (512, 10)).astype(np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(actor.logits(obs), expected, atol=1e-5)
    top2 = np.sort(expected, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4
    assert clear.mean() > 0.9
    assert (actor.actions(obs, True, torch.Generator())[clear] == expected.argmax(-1)[clear]).all()


def test_sb3s_own_blobs_import_only_known_globals(trained):
    with zipfile.ZipFile(trained[0]) as archive:
        data = json.loads(archive.read("data"))
    imports = pickle_globals(base64.b64decode(data["observation_space"][":serialized:"]))
    assert ("gymnasium.spaces.box", "Box") in imports and None not in imports


def test_weights_that_would_run_code_are_refused(trained, tmp_path):
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"action_net.weight": torch.zeros(2, 4), "payload": Payload(str(marker))}, buffer)
    crafted = tmp_path / "crafted.zip"
    _rewrite(trained[0], crafted, {"policy.pth": buffer.getvalue()})
    with pytest.raises(SpectuneError, match=r"is refused: policy\.pth holds more than tensors") as err:
        read_policy_file(crafted)
    assert "\n" not in str(err.value)
    assert not marker.exists()
    torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)  # control: the payload is live
    assert marker.exists()


def test_a_data_entry_that_would_run_code_is_refused(trained, tmp_path):
    marker = tmp_path / "pwned"
    with zipfile.ZipFile(trained[0]) as archive:
        data = json.loads(archive.read("data"))
    data["observation_space"][":serialized:"] = base64.b64encode(pickle.dumps(Payload(str(marker)))).decode()
    crafted = tmp_path / "crafted.zip"
    _rewrite(trained[0], crafted, {"data": json.dumps(data).encode()})
    with pytest.raises(SpectuneError, match=r"entry '/observation_space' would import io\.open"):
        read_policy_file(crafted)
    with pytest.raises(SpectuneError, match="refused"):
        make_policy({"name": "ppo", "gamma_path": str(crafted), "trust_pickle": False, "profile": None,
                     "allow_profile_mismatch": False, "deterministic": True, "seed": 0}, 4)
    assert not marker.exists()
    with contextlib.suppress(Exception):  # control: stable-baselines3's own load runs it (what follows is moot)
        PPO.load(crafted, device="cpu")
    assert marker.exists()


def test_unreadable_policy_files_fail_in_one_line(tmp_path):
    (tmp_path / "not.zip").write_text("hello")
    for path, match in ((tmp_path / "missing.zip", "no such file"), (tmp_path / "not.zip", "not a zip file")):
        with pytest.raises(SpectuneError, match=match) as err:
            read_policy_file(path)
        assert "\n" not in str(err.value)


def _node(path: str, **overrides) -> dict:
    return {"name": "ppo", "gamma_path": path, "trust_pickle": False, "profile": None,
            "allow_profile_mismatch": False, "deterministic": True, "seed": 0, **overrides}


def _step(step: int, **signals) -> DraftStep:
    tensors = {k: torch.tensor(v, dtype=torch.float64) for k, v in signals.items()}
    batch = len(next(iter(signals.values())))
    return DraftStep(step=step, active=torch.ones(batch, dtype=torch.bool),
                     context_length=torch.full((batch,), 10), batch_size=batch, **tensors)


def test_ppo_policy_acts_on_its_features_batched(tmp_path):
    """Continue iff 10·token_prob − 5 > 0, i.e. token_prob > 0.5, decided for all rows in one call."""
    policy = make_policy(_node(_linear_policy(tmp_path / "p.zip", bias_continue=-5.0, weight=10.0)), 6)
    assert policy.signals == {"token_prob"} and policy.begin_cycle(3) == 6
    assert policy.continue_drafting(_step(0, token_prob=[0.2, 0.7, 0.49, 0.51])).tolist() == [False, True, False, True]


@pytest.mark.parametrize(("bias_continue", "gamma"), [(-5.0, 0), (1.0, 6)])
def test_ppo_policys_step_zero_decision_covers_the_rows_it_knows(tmp_path, bias_continue, gamma):
    """The environment's step-0 choice, before anything is drafted: γ = 0 when every row whose context
    before_cycle named says stop (token_prob is 0 there, so the bias decides), else the ceiling; the same on the
    next cycle, when the step's constants come from the cache."""
    policy = make_policy(_node(_linear_policy(tmp_path / "p.zip", bias_continue=bias_continue, weight=10.0)), 6)
    policy.before_cycle([0, 1], [7, 8], [10, 12])
    assert policy.begin_cycle(2) == gamma
    policy.before_cycle([0, 1], [7, 8], [11, 13])
    assert policy.begin_cycle(2) == gamma


@pytest.mark.parametrize(("features", "actions", "match"), [
    (("token_prob", "position", "entropy"), 2, "observation shape"),
    (FEATURES, 3, r"Discrete\(3\)"),
])
def test_ppo_policy_refuses_files_whose_spaces_do_not_match(tmp_path, features, actions, match):
    path = tmp_path / "p.zip"
    _ppo(path, features, actions)
    annotate_policy_file(path, {"observation": list(FEATURES)})
    with pytest.raises(SpectuneError, match=match) as err:
        make_policy(_node(str(path)), 4)
    assert "\n" not in str(err.value)


def _profile(hardware: str) -> dict:
    return {"kind": "spectune-profile", "version": 1, "label": hardware, "synthetic": False, "models": {"t": 1},
            "hardware": {"device": hardware}, "batch_sizes": [1, 4], "max_positions": 3,
            "t_draft_s": {"1": 0.001, "4": 0.002}, "t_verify_s": {"1": [0.01, 0.011, 0.012], "4": [0.02, 0.03, 0.04]},
            "overhead_s": {"1": 0.0, "4": 0.0}}


def test_ppo_policy_trained_for_another_profile_needs_the_flag(tmp_path):
    path = _linear_policy(tmp_path / "p.zip", bias_continue=1.0, profile=_profile("cpu"))
    other = write_json(tmp_path / "h200.json", _profile("h200"))
    with pytest.raises(SpectuneError, match="allow_profile_mismatch") as err:
        make_policy(_node(path, profile=str(other)), 4)
    assert "\n" not in str(err.value)
    policy = make_policy(_node(path, profile=str(other), allow_profile_mismatch=True), 4)
    assert policy.describe()["profile_mismatch"] is True and policy.profile.label == "h200"
    same = make_policy(_node(path, profile=str(write_json(tmp_path / "cpu.json", _profile("cpu")))), 4)
    assert same.describe()["profile_mismatch"] is False
    own = make_policy(_node(path), 4)  # no policy.profile: the one the file was trained for
    assert own.profile.label == "cpu" and own.profile.c(4) == pytest.approx(0.1)


def test_a_file_without_feature_names_observes_the_fields_files_had_before_naming_them(tmp_path):
    from policies.envs.observation import UNNAMED

    path = tmp_path / "p.zip"
    _ppo(path, UNNAMED["gamma"])
    profile = write_json(tmp_path / "cpu.json", _profile("cpu"))
    policy = make_policy(_node(str(path), profile=str(profile)), 4)
    keep = policy.continue_drafting(_step(0, token_prob=[0.3, 0.9], entropy=[1.0, 0.1], margin=[0.1, 0.8],
                                          cum_prob=[0.3, 0.9]))
    assert keep.shape == (2,) and keep.dtype == torch.bool
    with pytest.raises(SpectuneError, match=r"policy\.profile"):
        make_policy(_node(str(path)), 4)  # c and g are features, and the file names no profile


@pytest.mark.parametrize("net_arch", [(), (16,), (16, 8)], ids=["linear", "one-hidden", "two-hidden"])
@pytest.mark.parametrize("continue_action", [0, 1], ids=["continue-first", "continue-second"])
def test_the_split_decision_is_the_actors_argmax(tmp_path, net_arch, continue_action):
    """The deterministic per-step decision through the split first layer (signals read at once, the step's and the
    rows' shares cached) against the actor's argmax on the full observation: a real SB3 file over every feature,
    its weights redrawn at scale 1 (seeded), 3 cycles × 6 steps × 8 rows of seeded signals and contexts, with
    recent acceptance moving between cycles. Equal wherever the two logits are 1e-4 apart (float32 rounding)."""
    path = tmp_path / "p.zip"
    model = _ppo(path, DEFAULT_OBSERVATION, net_arch=net_arch)
    gen = torch.Generator().manual_seed(len(net_arch) + 10 * continue_action)
    with torch.no_grad():
        for param in model.policy.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    model.save(path)
    annotate_policy_file(path, {"observation": list(DEFAULT_OBSERVATION),
                                "actions": ["stop", "continue"] if continue_action else ["continue", "stop"]})
    policy = make_policy(_node(str(path), profile=str(write_json(tmp_path / "cpu.json", _profile("cpu")))), 6)
    assert policy.split is not None
    rng = np.random.default_rng(continue_action)
    compared = agreed = 0
    rows = 8
    for _ in range(3):
        lengths = rng.integers(1, 400, rows)
        policy.before_cycle(list(range(rows)), list(range(rows)), lengths.tolist())
        policy.begin_cycle(rows)
        for step in range(6):
            probs = rng.uniform(0, 1, (rows, 3))
            draft = DraftStep(step=step, active=torch.ones(rows, dtype=torch.bool),
                              context_length=torch.tensor(lengths), batch_size=rows,
                              token_prob=torch.tensor(probs[:, 0], dtype=torch.float32),
                              entropy=torch.tensor(rng.uniform(0, 5, rows), dtype=torch.float32),
                              margin=torch.tensor(probs[:, 1], dtype=torch.float32),
                              cum_prob=torch.tensor(probs[:, 0] * probs[:, 2], dtype=torch.float64))
            keep = policy.continue_drafting(draft).numpy()  # the engine's call (step 0 reads the rows)
            assert (policy.decide(draft).numpy() == keep).all()  # ... which took the split path
            logits = policy.actor.logits(policy.observation(draft))
            clear = np.abs(logits[:, 0] - logits[:, 1]) > 1e-4
            compared += int(clear.sum())
            agreed += int((keep[clear] == (logits.argmax(-1) == policy.continue_action)[clear]).sum())
        policy.observe(CycleFeedback(num_drafts=[6] * rows, num_accepted=rng.integers(0, 7, rows).tolist(),
                                     draft_s=0.0, verify_s=0.0, cycle_s=0.0, rows=list(range(rows)),
                                     request_ids=list(range(rows))))
    assert compared >= 0.9 * 3 * 6 * 8 and agreed == compared


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(vocab=64, hidden=32, layers=2, seed=1, init=0.1)
    return target, perturbed(target, scale=0.3, seed=2)


def test_ppo_observation_is_the_gamma_environments(tmp_path):
    """The engine-side features, scaled, equal policies.envs.observation.gamma_observation for the same values."""
    from policies.envs.observation import gamma_observation

    path = tmp_path / "p.zip"
    features = tuple(DEFAULT_OBSERVATION[:10])  # the fields this test gives values for
    _ppo(path, features)
    policy = make_policy(_node(str(path), profile=str(write_json(tmp_path / "cpu.json", _profile("cpu")))), 2)
    step = DraftStep(step=0, active=torch.ones(3, dtype=torch.bool), context_length=torch.tensor([40, 0, 250]),
                     batch_size=3, token_prob=torch.tensor([0.3, 0.5, 0.9], dtype=torch.float64),
                     entropy=torch.tensor([2.0, 1.0, 0.1], dtype=torch.float64),
                     margin=torch.tensor([0.1, 0.2, 0.8], dtype=torch.float64),
                     cum_prob=torch.tensor([0.3, 0.5, 0.9], dtype=torch.float64))
    profile = policy.profile
    expected = gamma_observation(features, token_prob=step.token_prob.numpy(),
                                 entropy=step.entropy.numpy(), margin=step.margin.numpy(),
                                 cum_prob=step.cum_prob.numpy(), position=1, context_length=step.context_length.numpy(),
                                 batch_size=2, recent_acceptance=0.5, c=profile.c(2), g=profile.g(2, 2))
    np.testing.assert_allclose(policy.observation(step), expected, rtol=1e-6)


@pytest.mark.parametrize("reads_context", [True, False], ids=["context", "no-context"])
@pytest.mark.parametrize("bias", [5.0, -5.0], ids=["always-continue", "always-stop"])
def test_ppo_policy_in_the_engine_keeps_greedy_output_and_drafts_as_its_actor_says(pair, tmp_path, bias,
                                                                                   reads_context):
    """Always continue: every cycle drafts the ceiling. Always stop: no cycle speculates (the step-0 decision:
    γ = 0), a new request's first included, since ``before_cycle`` gives its context. Without the context (a
    caller that does not pass it) every request's first cycle drafts once (its slot is new to the policy), every
    later cycle of it does not speculate."""
    target, draft = pair
    gen = torch.Generator().manual_seed(0)
    requests = [Request(i, f"p{i}", "en", torch.randint(0, 64, (5 + i,), generator=gen).tolist(), 10)
                for i in range(3)]
    engine = Engine(target, draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    policy = make_policy(_node(_linear_policy(tmp_path / "p.zip", bias_continue=bias)), 5)
    policy.reads_context = reads_context
    for concurrency in (1, 3):
        result = engine.run(requests, policy, concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference
        if bias > 0:
            assert {c.num_drafts for c in result.cycles} == {5}
            continue
        by_request: dict[int, list[int]] = {}
        for cycle in sorted(result.cycles, key=lambda c: c.cycle):
            by_request.setdefault(cycle.request_id, []).append(cycle.num_drafts)
        if reads_context:
            assert {d for drafts in by_request.values() for d in drafts} == {0}, by_request
            continue
        later = {d for drafts in by_request.values() for d in drafts[1:]}
        # At concurrency 3 a finished request changes the batch's row count: the policy speculates (1 draft) then.
        assert {drafts[0] for drafts in by_request.values()} == {1}, by_request
        assert later == {0} if concurrency == 1 else 0 in later <= {0, 1}, by_request


def test_a_policy_file_notes_a_typed_configs_choices_by_name(trained, tmp_path):
    """The profile a policy was trained for carries the measured setup's config, where suffix decoding's corpus is
    an enum member (spectune.engine.proposers.suffix.Corpus): the file stores it by name, as every run file does,
    and reads back."""
    from spectune.engine.proposers.suffix import Corpus

    source, _ = trained
    path = tmp_path / "gamma.zip"
    shutil.copy(source, path)
    annotate_policy_file(path, {"observation": list(FEATURES), "actions": ["stop", "continue"],
                                "profile": {"metadata": {"proposer": {"name": "suffix", "corpus": Corpus.train}}}})
    assert read_policy_file(path).extra["profile"]["metadata"]["proposer"] == {"name": "suffix", "corpus": "train"}


def test_a_policy_file_names_its_observation_schema_and_one_without_a_version_is_version_1(trained, tmp_path):
    """A file written from now on stores {"kind", "version", "features"}; an older one (a bare list of names) is
    read as version 1 with those names: the two build the same observation and decide alike."""
    from policies.envs.observation import GAMMA
    from policies.ppo import PPOGamma

    source, _ = trained
    old, new = tmp_path / "old.zip", tmp_path / "new.zip"
    shutil.copy(source, old)
    shutil.copy(source, new)
    annotate_policy_file(old, {"observation": list(FEATURES), "actions": ["stop", "continue"]})
    annotate_policy_file(new, {"observation": GAMMA.of(FEATURES).schema(), "actions": ["stop", "continue"]})
    assert read_policy_file(new).extra["observation"] == {"kind": "gamma", "version": 1, "features": list(FEATURES)}
    step = _step(0, token_prob=[0.1, 0.6, 0.95])
    a, b = (PPOGamma(4, str(p), False, None, False, True, 0) for p in (old, new))
    assert a.features == b.features == FEATURES
    assert a.observation(step).tobytes() == b.observation(step).tobytes()


@pytest.mark.parametrize("observation", [
    ["token_prob", "speed_of_light"],
    {"kind": "gamma", "version": 2, "features": list(FEATURES)},
    {"kind": "cycle", "version": 1, "features": list(FEATURES)},
], ids=["unknown-name", "newer-version", "other-kind"])
def test_a_file_whose_observation_the_builder_does_not_make_fails_in_one_line(trained, tmp_path, observation):
    source, _ = trained
    path = tmp_path / "gamma.zip"
    shutil.copy(source, path)
    annotate_policy_file(path, {"observation": observation, "actions": ["stop", "continue"]})
    with pytest.raises(SpectuneError, match="are not the gamma observation's") as err:
        make_policy(_node(str(path)), 4)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "'token_prob'" in message and "'g'" in message
