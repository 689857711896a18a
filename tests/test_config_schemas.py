"""Typed configs: every YAML file of the task, workload, hardware, models and proposer groups and conf/config.yaml's
own keys have a dataclass schema (spectune/config.py, harness/tasks/schemas.py, and for task/train.yaml and
task/evaluate.yaml policies/train/schema.py and policies/evaluate/schema.py), so that a value
of the wrong type or an unknown key fails as Hydra composes: one ``error:`` line naming the key, the value and what is
allowed, exit code 2, before the job starts (so before any model loads). The schemas add types only: the composed
configs are the YAML files' (tests/test_pinned_outputs.py pins their text).

The keys a case breaks are drawn from the schemas with a seeded generator (SEED): each run checks the same ones.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import types
import typing
from typing import Any

import pytest
from omegaconf import OmegaConf

from spectune.config import (
    HardwareConfig,
    MixWorkloadConfig,
    ModelsConfig,
    NotedModelsConfig,
    ProfiledModelsConfig,
    RootConfig,
    WorkloadConfig,
    describe,
    typed,
)
from spectune.engine import proposers
from spectune.errors import SpectuneError
from spectune.run.cli import hydra_entry, task_alias
from tests.conftest import REPO

SEED = 20261205
KEYS_PER_GROUP = 2  # wrong-typed keys drawn per group (and one unknown key each)
# conf/models/<file> -> its schema: a key only some pairs have is a subclass's (spectune.config.ModelsConfig)
MODELS = {"tiny": ProfiledModelsConfig, "smollm2": NotedModelsConfig, "smollm2-eagle": NotedModelsConfig,
          "llama3-8b-1b": ModelsConfig, "qwen2.5-7b-0.5b": ModelsConfig, "vicuna-7b-68m": ModelsConfig}
# conf/proposer/<file> -> its schema: each proposer's settings, from the registry (spectune/engine/proposers/)
PROPOSERS = {name: proposers.entry(name).settings for name in proposers.names()}


def _leaves(schema: type, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, type hint) of every typed leaf of ``schema`` (nested schemas walked; ``Any`` is untyped)."""
    out = []
    for item in dataclasses.fields(schema):
        hint = typing.get_type_hints(schema)[item.name]
        key = f"{prefix}{item.name}"
        if dataclasses.is_dataclass(hint):
            out += _leaves(hint, f"{key}.")
        elif hint is not Any:
            out.append((key, hint))
    return out


def _wrong(hint: Any) -> str:
    """An override value that ``hint`` does not allow (as Hydra parses the command line)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] if union else [hint]
    if any(typing.get_origin(k) in (list, dict) for k in kinds):
        return "3"  # a number is no list and no mapping
    if str in kinds:
        return "[1,2]"  # a list is no string
    return "maybe" if kinds == [bool] else "abc"  # no bool; no integer or number


def _cases() -> list[Any]:
    """(module, config name, overrides, broken key, kind) per group: wrong types drawn from its schema, a bad key."""
    from harness.tasks.schemas import SCHEMAS
    from policies.evaluate.schema import EvaluateFile
    from policies.train.schema import TrainFile

    rng = random.Random(SEED)
    task = rng.choice(sorted(SCHEMAS))
    task_schema, root = SCHEMAS[task]
    groups = {
        "task": ("harness", "config", [f"task={task}"], _leaves(task_schema, "" if root else "task.")),
        "workload": ("harness", "config", ["+workload=mix"], _leaves(MixWorkloadConfig, "workload.")),
        "hardware": ("harness", "config", [f"hardware={rng.choice(['cpu', 'cpu-static', 'cuda', 'cuda-compiled'])}"],
                     _leaves(HardwareConfig, "hardware.")),
        "train": ("policies.train", "config", ["task=train"], _leaves(TrainFile, "")),
        "evaluate": ("policies.evaluate", "config", ["task=evaluate"], _leaves(EvaluateFile, "")),
    }
    models = rng.choice(sorted(MODELS))
    groups["models"] = ("harness", "config", [f"models={models}"], _leaves(MODELS[models], "models."))
    groups["root"] = ("harness", "config", [], _leaves(RootConfig, ""))
    for name, schema in PROPOSERS.items():  # every proposer's schema (proposer=model has one key: its name)
        groups[f"proposer-{name}"] = ("harness", "config", [f"proposer={name}"], _leaves(schema, "proposer."))
    cases = []
    for group, (module, config, base, leaves) in groups.items():
        for key, hint in rng.sample(leaves, min(KEYS_PER_GROUP, len(leaves))):
            cases.append(pytest.param(module, config, [*base, f"{key}={_wrong(hint)}"], key, "type",
                                      id=f"{group}-type-{key}"))
        node = {"task": "task", "workload": "workload", "hardware": "hardware", "train": "train.ppo",
                "evaluate": "evaluate", "models": "models.draft", "root": "slo"}.get(group, "proposer")
        cases.append(pytest.param(module, config, [*base, f"{node}.no_such_key=1"], f"{node}.no_such_key", "unknown",
                                  id=f"{group}-unknown"))
    return cases


@pytest.mark.parametrize(("module", "config", "overrides", "key", "kind"), _cases())
def test_a_wrong_type_or_an_unknown_key_fails_in_one_line_with_exit_2_before_the_job(monkeypatch, capsys, module,
                                                                                     config, overrides, key, kind):
    """Through the front door (cli.hydra_entry, as ``python -m MODULE`` runs it): exit 2, one error line naming the
    key (and for a type, its value and what is allowed), and the job -- where models load -- never starts."""
    started = []
    monkeypatch.setattr(sys, "argv", [module, *overrides])
    with pytest.raises(SystemExit) as stop:
        hydra_entry(lambda: started.append(True), config)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and not started
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {key}"), err
    if kind == "type":
        assert f"error: {key}=" in err and " is invalid: must be " in err, err
    else:
        assert err == f"error: {key} is not a key of the config: check its spelling, or add it with +{key}=...", err


@pytest.mark.parametrize(("module", "overrides", "message"), [
    ("harness", ["+workload=en", "workload.num_prompts=abc"],
     "error: workload.num_prompts='abc' is invalid: must be an integer or null"),
    ("policies.train", ["train.ppo.n_steps=1.5"], "error: train.ppo.n_steps=1.5 is invalid: must be an integer"),
    ("harness", ["task=train", "train.ppo.n_steps=1.5"], "error: train.ppo.n_steps=1.5 is invalid: must be an integer"),
    ("policies.evaluate", ["+workload=en", "evaluate.hindsight=maybe"],
     "error: evaluate.hindsight='maybe' is invalid: must be true or false"),
    ("harness", ["slo.ttft_ms=x"], "error: slo.ttft_ms='x' is invalid: must be a number or null"),
    ("policies.train", ["models.target.revision=[1,2]"],  # the alias composes the models group too
     "error: models.target.revision=[1, 2] is invalid: must be a string or null"),
])
def test_each_application_registers_its_schemas_at_import_and_fails_in_one_line(cli, tmp_path, module, overrides,
                                                                               message):
    """A real process per application: its entry module registers the schemas before Hydra composes, so a wrong
    type is one line and exit code 2, and nothing but logs is written."""
    done = cli(*overrides, run_dir=tmp_path / "run", module=module, timeout=300)
    assert done.returncode == 2 and done.stderr.strip() == message, (done.returncode, done.stderr[-2000:])
    assert not (tmp_path / "run").exists() or not [p for p in (tmp_path / "run").iterdir() if p.suffix != ".log"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["seed=abc"], "error: seed='abc' is invalid: must be an integer"),
    (["resume=maybe"], "error: resume='maybe' is invalid: must be true or false"),
    (["+workload=en", "workload.ignore_eos=maybe"],
     "error: workload.ignore_eos='maybe' is invalid: must be true or false"),
    (["slo.ttft_ms=x"], "error: slo.ttft_ms='x' is invalid: must be a number or null"),
    (["sampler=[1]"], "error: sampler=[1] is invalid: must be a string"),
    (["models=smollm2", "models.weights_note=[1]"], "error: models.weights_note=[1] is invalid: must be a string"),
    (["models=llama3-8b-1b", "models.prompt_profile=short"],  # tiny's key, not llama's
     "error: models.prompt_profile is not a key of the config: check its spelling, or add it with "
     "+models.prompt_profile=..."),
    (["proposer=lookup", "proposer.max_n=abc"], "error: proposer.max_n='abc' is invalid: must be an integer"),
    (["proposer.max_n=3"],  # proposer=model has no settings
     "error: proposer.max_n is not a key of the config: check its spelling, or add it with +proposer.max_n=..."),
    (["-m", "seed=1,x"], "error: seed='x' is invalid: must be an integer (a value of the sweep seed=1,x)"),
])
def test_the_root_models_and_proposer_keys_fail_in_these_lines(monkeypatch, capsys, overrides, message):
    """The messages a user meets, word for word (the drawn cases above check their shape)."""
    started = []
    monkeypatch.setattr(sys, "argv", ["harness", *overrides])
    with pytest.raises(SystemExit) as stop:
        hydra_entry(lambda: started.append(True), "config")
    assert stop.value.code == 2 and not started
    assert capsys.readouterr().err.strip() == message


@pytest.mark.parametrize("task", ["bench", "train", "evaluate"])
@pytest.mark.parametrize("spelling", ["proposer=lookup", "+proposer=lookup"])
def test_every_task_takes_the_proposer_as_the_harness_does(monkeypatch, task, spelling):
    """Every task defaults to the pair's draft model and takes proposer=lookup; ``+proposer=lookup``, as commands
    written for python -m policies.train|evaluate before their config had that default spell it, means the same
    (through the aliases: task=train and task=evaluate)."""
    from hydra import compose, initialize_config_dir

    seen = []
    monkeypatch.setattr(sys, "argv", ["app", "+workload=en", spelling])
    if task == "bench":
        hydra_entry(lambda: seen.append(sys.argv[1:]), "config")
        want = ["+workload=en", "proposer=lookup"]
    else:
        task_alias(lambda: seen.append(sys.argv[1:]), task, f"python -m policies.{task}")
        want = [f"task={task}", "+workload=en", "proposer=lookup"]
    assert seen == [want]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        assert compose(config_name="config", overrides=seen[0]).proposer.name == "lookup"
        assert compose(config_name="config", overrides=[f"task={task}", "+workload=en"]).proposer.name == "model"


def _options(group: str) -> str:
    return ", ".join(sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml") if not p.stem.startswith("_")))


@pytest.mark.parametrize(("module", "override", "group"), [
    ("harness", "models=nope", "models"), ("harness", "proposer=nope", "proposer"),
    ("harness", "hardware=nope", "hardware"), ("harness", "policy=nope", "policy"), ("harness", "task=nope", "task"),
    ("harness", "+workload=nope", "workload"), ("harness", "proposer=model,nope", "proposer"),
    ("policies.train", "models=nope", "models"), ("policies.evaluate", "hardware=nope", "hardware"),
])
def test_an_unknown_option_of_a_group_fails_in_one_line_listing_its_options(monkeypatch, capsys, module, override,
                                                                             group):
    """Every folder of conf/ is a group whose options are checked before Hydra composes (whose own message is
    several lines): the bad value and the group's files, exit 2, no job."""
    started = []
    monkeypatch.setattr(sys, "argv", [module, override])
    with pytest.raises(SystemExit) as stop:
        _entry(module, lambda: started.append(True))
    assert stop.value.code == 2 and not started
    assert capsys.readouterr().err.strip() == f"error: {group}='nope' is unknown: choose one of {_options(group)}"
    assert "tiny" in _options("models") and {"model", "lookup"} <= set(_options("proposer").split(", "))


def _entry(module: str, main: Any) -> None:
    """What ``python -m MODULE`` does before its job, in this process: the front door's checks, or an alias's."""
    if module == "harness":
        hydra_entry(main, "config")
    else:
        task_alias(main, module.split(".")[-1], f"python -m {module}")


@pytest.mark.parametrize("module", ["harness", "policies.evaluate"])
def test_an_unknown_launcher_fails_in_one_line_listing_hydras_options(monkeypatch, capsys, module):
    """Hydra's own groups are checked too: the options it finds, the project's SLURM launcher and the submitit
    plugin's among them; a known one passes the check."""
    started = []
    monkeypatch.setattr(sys, "argv", [module, "-m", "hydra/launcher=slrum", "+workload=en"])
    with pytest.raises(SystemExit) as stop:
        _entry(module, lambda: started.append(True))
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and not started and len(err.splitlines()) == 1, err
    assert err.startswith("error: hydra/launcher='slrum' is unknown: choose one of basic, "), err
    assert {"slurm", "submitit_local", "submitit_slurm"} <= set(err.split("choose one of ")[1].split(", ")), err
    monkeypatch.setattr(sys, "argv", [module, "-m", "hydra/launcher=basic", "+workload=en"])
    _entry(module, lambda: started.append(True))
    assert started == [True]


def test_a_later_value_of_a_sweep_with_the_wrong_type_fails_before_any_job(monkeypatch, capsys):
    """Hydra composes a sweep's job only when it comes; the front door sets every swept value on the first job's
    config first, so ``-m task.warmup=1,abc`` is one line before the sweep starts."""
    started = []
    monkeypatch.setattr(sys, "argv", ["harness", "-m", "task=trace", "task.warmup=1,abc"])
    with pytest.raises(SystemExit) as stop:
        hydra_entry(lambda: started.append(True), "config")
    assert stop.value.code == 2 and not started
    assert capsys.readouterr().err.strip() == ("error: task.warmup='abc' is invalid: must be an integer (a value of "
                                               "the sweep task.warmup=1,abc)")


def test_every_schema_key_has_its_value_in_the_yaml_files(compose_config):
    """The schemas carry no defaults: every key they type is set by its YAML file (no ``???`` after composing),
    for each task, hardware and bundled workload."""
    from harness.tasks.schemas import SCHEMAS

    assert sorted(SCHEMAS) == _options("task").split(", ")  # every task's file is typed
    for task in SCHEMAS:
        for hardware in ("cpu", "cpu-static", "cuda", "cuda-compiled"):
            assert not OmegaConf.missing_keys(compose_config(f"task={task}", f"hardware={hardware}", "+workload=mix"))
    for workload in ("en", "es", "it", "zh"):
        assert OmegaConf.get_type(compose_config(f"+workload={workload}").workload) is WorkloadConfig
    for models, schema in MODELS.items():
        assert OmegaConf.get_type(compose_config(f"models={models}").models) is schema
    for name, schema in PROPOSERS.items():
        cfg = compose_config(f"proposer={name}")
        assert OmegaConf.get_type(cfg.proposer) is schema and not OmegaConf.missing_keys(cfg)
    assert sorted(MODELS) == _options("models").split(", ")  # every pair's file is typed


@pytest.mark.parametrize("group", ["models", "proposer"])
def test_a_models_or_proposer_file_composes_to_its_own_keys_in_its_order(compose_config, group):
    """The schemas add types only (the pins hold models=tiny and proposer=model): each file's node, composed, is
    the file's own keys and values, in its order, so no schema adds a key (a default) or moves one."""
    for path in sorted((REPO / "conf" / group).glob("*.yaml")):
        own = OmegaConf.load(path)
        own.pop("defaults", None)
        assert OmegaConf.to_yaml(compose_config(f"{group}={path.stem}")[group]) == OmegaConf.to_yaml(own), path.name


def test_a_plain_config_is_read_through_the_same_schema():
    """A config that did not come through Hydra (a caller's own dict) gets the same types, in one line; a missing
    key is named; a key added with +key=... is the caller's own and ignored; interpolations are resolved."""
    from harness.tasks.schemas import TraceTask

    node = {"name": "trace", "max_gamma": 4, "concurrency": 1, "warmup": 0, "extra": "mine"}
    assert typed(TraceTask, node, "task") == TraceTask("trace", 4, 1, 0)
    with pytest.raises(SpectuneError, match=r"^task\.max_gamma='x' is invalid: must be an integer$"):
        typed(TraceTask, {**node, "max_gamma": "x"}, "task")
    with pytest.raises(SpectuneError, match=r"^task\.warmup is missing: set it in its conf/ file"):
        typed(TraceTask, {k: v for k, v in node.items() if k != "warmup"}, "task")
    cfg = OmegaConf.create({"gamma": 6, "task": {**node, "max_gamma": "${gamma}"}})
    assert typed(TraceTask, cfg.task, "task").max_gamma == 6


@pytest.mark.parametrize(("hint", "words"), [
    (int, "an integer"), (int | None, "an integer or null"), (float, "a number"), (int | float, "a number"),
    (bool, "true or false"), (str | bool, "a string, true or false"), (list[int], "a list of integers"),
    (list[str] | None, "a list of strings or null"), (dict[str, Any] | None, "a mapping or null"),
])
def test_what_a_schema_allows_is_said_in_words(hint, words):
    assert describe(hint) == words
