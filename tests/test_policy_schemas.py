"""A policy's config is typed by its constructor: policies.registry.parameters_schema, read through OmegaConf."""

from __future__ import annotations

import dataclasses
import re

import pytest
from omegaconf import OmegaConf

from policies.registry import POLICIES, make_policy, parameters_schema
from spectune.config import typed
from spectune.errors import SpectuneError
from tests.conftest import REPO

POLICY_FILES = sorted(p.stem for p in (REPO / "conf" / "policy").glob("*.yaml"))


@pytest.mark.parametrize("name", POLICY_FILES)
def test_every_policy_file_is_read_through_its_constructors_schema(name):
    """Each conf/policy file names a policy whose schema has exactly the file's keys and types every value there."""
    node = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "policy" / f"{name}.yaml"), resolve=False)
    assert node.pop("name") == name and name in POLICIES
    schema = parameters_schema(POLICIES[name])
    assert sorted(f.name for f in dataclasses.fields(schema)) == sorted(node)
    values = typed(schema, node, prefix="policy")
    assert {key: getattr(values, key) for key in node} == node  # what the file says, unchanged


@pytest.mark.parametrize(("node", "message"), [
    ({"name": "confidence", "threshold": "abc"}, "policy.threshold='abc' is invalid: must be a number"),
    ({"name": "hf-heuristic", "max_gamma": 2.5}, "policy.max_gamma=2.5 is invalid: must be an integer"),
    ({"name": "step-thresholds", "thresholds": [0.1, "x"]}, "policy.thresholds[1]='x' is invalid: must be a number"),
    ({"name": "confidence-adaptive", "threshold": 0.4, "fn_weight": 1.0, "min_samples": "many", "scope": "row"},
     "policy.min_samples='many' is invalid: must be an integer"),
    ({"name": "svip", "h": None}, "policy.h=None is invalid: must be a number"),
])
def test_a_wrong_type_is_one_line_naming_the_key_the_value_and_what_is_allowed(node, message):
    with pytest.raises(SpectuneError, match=re.escape(message)):
        make_policy(node, 4)


def test_a_typed_value_reaches_the_policy_as_its_type():
    """An integer written where the constructor takes a float arrives as a float (OmegaConf's conversion)."""
    policy = make_policy({"name": "confidence", "threshold": 1}, 4)
    assert isinstance(policy.threshold, float) and policy.threshold == 1.0


def test_the_benchmark_refuses_a_wrong_type_before_any_model_loads(harness_in_process, tmp_path):
    with pytest.raises(SpectuneError, match=re.escape("policy.threshold='high' is invalid: must be a number")):
        harness_in_process(tmp_path, "+workload=en", "policy=confidence", "policy.threshold=high")
    assert not (tmp_path / "metadata.json").exists()
