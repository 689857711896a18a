"""The proposer registry (spectune/engine/proposers/): every registered proposer is one module and one config, its
session proposer has every member of the Proposer protocol (spectune/engine/proposer.py) with the protocol's
signatures and runs a cycle through exactly those calls, bad names and settings fail in one line naming what is
allowed, and a setting out of range stops a real command line before any model loads.

Tiny random pair (tests/tiny_models.py, float64), greedy, 2 slots, prompts that repeat a phrase: every proposer
drafts in the cycle it runs.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from spectune.engine import Engine, Request, proposers
from spectune.engine.policy import FixedGamma
from spectune.engine.proposer import Proposer
from spectune.engine.proposers import DraftSources
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.conftest import REPO

PROPOSER_CONF = REPO / "conf" / "proposer"
# what an unknown name's message lists: every conf/proposer/ file, the default (conf/config.yaml's) first
KNOWN = ", ".join(sorted((p.stem for p in PROPOSER_CONF.glob("*.yaml")), key=lambda name: (name != "model", name)))


def protocol_members() -> dict[str, object]:
    """The Proposer protocol's members: its attributes (annotations) and its methods and properties."""
    members: dict[str, object] = dict.fromkeys(Proposer.__annotations__)
    members.update({name: value for name, value in vars(Proposer).items()
                    if not name.startswith("_") and (callable(value) or isinstance(value, property))})
    return members


def test_the_protocol_names_what_the_session_calls():
    """The members the session, the engine and the trace recorder use (every ``<x>.proposer.<member>`` in their
    code) are the protocol's, and the protocol holds nothing they never use but ``support`` (a reduced-vocabulary
    draft's ids, which the tests of the offline drafts read)."""
    used: set[str] = set()
    for module in ("session.py", "engine.py", "traces.py"):
        tree = ast.parse((REPO / "spectune" / "engine" / module).read_text(encoding="utf-8"))
        used |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                 and isinstance(node.value, ast.Attribute) and node.value.attr == "proposer"}
    members = set(protocol_members())
    assert "step" in used and used - members == set(), used - members
    assert members - used <= {"support"}, members - used


def test_every_config_has_an_entry_and_every_entry_a_config():
    files = sorted(path.stem for path in PROPOSER_CONF.glob("*.yaml"))
    assert files == sorted(proposers.names()) and len(files) >= 3, (files, proposers.names())
    for name in proposers.names():
        entry = proposers.entry(name)
        own = OmegaConf.load(PROPOSER_CONF / f"{name}.yaml")
        assert f"/schema/proposer/{name}@_here_" in own.defaults and own.name == name, name
        own.pop("defaults")
        # the schema's fields are the file's keys, in its order, and none has a default (the file holds the values)
        fields = dataclasses.fields(entry.settings)
        assert [f.name for f in fields] == list(own), name
        assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in fields)
        assert callable(entry.settings.check), name


def test_the_registry_and_every_entry_import_without_torch():
    """The front door imports every entry to store their schemas and checks the settings before any model loads:
    none of that may import torch (1-3 s), which only a session's proposer needs."""
    code = ("import sys\nfrom spectune.engine import proposers\n"
            "[proposers.entry(n) for n in proposers.names()]\nproposers.register_schemas()\n"
            "proposers.check({'name': 'suffix'})\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(("node", "message"), [
    ({"name": "ngram"}, f"proposer='ngram' is unknown: choose one of {KNOWN}"),
    ({"name": "lookup", "n": 3}, "proposer.n is not a setting of proposer=lookup: its settings are max_n, min_n"),
    ({"name": "model", "max_n": 3}, "proposer.max_n is not a setting of proposer=model: its settings are none"),
    ({"name": "lookup", "min_n": 5},
     "proposer.min_n=5 is out of range: must be an integer in [1, 3] (prompt lookup needs 1 <= min_n <= max_n, "
     "and proposer.max_n=3)"),
    ({"name": "suffix", "corpus": "eval"}, "proposer.corpus='eval' is invalid: must be one of train, none"),
    ({"name": "suffix", "min_token_prob": 1.5}, "proposer.min_token_prob=1.5 is out of range: must be in [0, 1]"),
])
def test_a_bad_proposer_or_setting_fails_in_one_line_naming_what_is_allowed(node, message):
    with pytest.raises(SpectuneError) as raised:
        proposers.check(node)
    assert str(raised.value) == message and "\n" not in str(raised.value)


def test_settings_left_out_take_the_config_files_values():
    """A caller's node may name only what it changes: the rest is conf/proposer/<name>.yaml's, as composing gives."""
    _, settings = proposers.settings_of({"name": "lookup", "max_n": 4})
    assert (settings.max_n, settings.min_n) == (4, OmegaConf.load(PROPOSER_CONF / "lookup.yaml").min_n)
    entry, _ = proposers.settings_of(None)
    assert entry.name == proposers.DEFAULT and entry.needs_draft_model


def test_an_entry_without_a_label_is_named_by_its_settings():
    from spectune.engine.proposers.base import by_settings

    assert by_settings({"name": "repeat", "length": 4, "exact": True}, {}) == "repeat (length 4, exact True)"
    assert by_settings({"name": "repeat"}, {}) == "repeat"
    assert proposers.label({"name": "gone", "k": 1}, {}) == "proposer gone"  # a run of a proposer since removed


def engines(pair, feature_pair) -> dict[str, Engine]:
    """An engine per registered proposer, its draft built by its entry from its file's settings (the tiny draft
    model; no special ids; no corpus), and one more for the model entry with a draft that reads the features."""
    out = {}
    for name in proposers.names():
        entry, settings = proposers.settings_of({"name": name})
        drafts = {name: pair[1]} if entry.needs_draft_model else {}
        if entry.needs_draft_model:
            drafts[f"{name} (features)"] = feature_pair[1]
        for label, model in (drafts or {name: None}).items():
            target = feature_pair[0] if "features" in label else pair[0]
            built = entry.draft(settings, DraftSources(draft_model=model))
            out[label] = Engine(target, built, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                                device="cpu", seed=0)
    return out


def test_every_proposer_has_the_protocols_members_and_serves_a_session(pair, feature_pair):
    """Members checked one by one on each session proposer (the model draft's, the feature-reading draft's, each
    model-free draft's) in an open cycle: attributes present and typed, methods and properties with the protocol's
    parameters. Then the session runs to the end on those calls alone, greedy at γ 2 over 2 slots, and emits what
    plain decoding emits, with drafts accepted."""
    members = protocol_members()
    requests = [Request(i, f"p{i}", "en", [5 + i, 6, 7, 5 + i, 6, 7, 5 + i, 6], 10) for i in range(3)]
    for name, engine in engines(pair, feature_pair).items():
        plain = Engine(engine.target, None, sampling=engine.sampling, sampler=engine.sampler, device="cpu", seed=0)
        reference = {r.request_id: r.output_ids for r in plain.run(requests, None, 1).requests}
        session = engine.session(requests, FixedGamma(2), 2)
        assert session.begin_cycle()
        session.draft_step()
        proposer = session.proposer
        for member, declared in members.items():
            assert hasattr(proposer, member), (name, member)
            if isinstance(declared, property):
                assert isinstance(inspect.getattr_static(type(proposer), member), property), (name, member)
            elif callable(declared):
                own = list(inspect.signature(getattr(proposer, member)).parameters)
                want = list(inspect.signature(declared).parameters)[1:]  # without self
                assert own == want, (name, member, own, want)
        assert proposer.kv is None or hasattr(proposer.kv, "compact"), name
        assert isinstance(proposer.reports, frozenset) and proposer.reports, name
        assert proposer.first_draft is None or callable(proposer.first_draft), name
        assert proposer.running.shape == (2,) and proposer.running.dtype == torch.bool, name
        assert proposer.gamma == 1 and proposer.num_drafts.shape == (2,), name
        session.verify()
        while not session.done:
            session.step()
        result = session.result()
        assert {r.request_id: r.output_ids for r in result.requests} == reference, name
        assert sum(c.accepted for c in result.cycles) > 0, name


def test_a_setting_out_of_range_stops_the_command_line_before_any_model_loads(cli, tmp_path):
    """``python -m harness +workload=en proposer=lookup proposer.min_n=5`` as a user types it: exit code 2, one
    error line naming the key, the value and what is allowed, and no weights loaded (no loading line, no result)."""
    done = cli("+workload=en", "proposer=lookup", "proposer.min_n=5", run_dir=tmp_path / "run", timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: proposer.min_n=5 is out of range: must be an integer in [1, 3] (prompt lookup needs "
                     "1 <= min_n <= max_n, and proposer.max_n=3)"], done.stderr[-2000:]
    logs = done.stdout + done.stderr + "".join(p.read_text() for p in (tmp_path / "run").glob("*.log"))
    assert "loading weights" not in logs.lower() and "weights" not in logs.lower(), logs[-2000:]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".hydra", "__main__.log"]  # no result
