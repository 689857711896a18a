"""workload.categories selects prompt categories through Hydra: interleaved in equal shares, each prompt with its
category, the profile chosen by the models config, and bad selections one line (exit 2) before any model loads."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from spectune.errors import SpectuneError
from workloads.categories import check_workload
from workloads.loader import load_workload


@pytest.mark.parametrize("overrides", [["workload.categories=[chat-lines]"], ["task=tune"], ["task=acceptance"]])
def test_the_chat_lines_are_unchanged_where_asked_for_and_in_every_task_but_the_bench(compose_config, tokenizer,
                                                                                     overrides):
    """The main job (task=bench) measures the built categories by default (tests/test_main_job.py); the dialogue
    lines stay one override away, and stay the default of the other tasks."""
    wl = load_workload(compose_config("+workload=it", *overrides).workload, tokenizer)
    assert {p.category for p in wl.prompts} == {"chat-lines"} and {p.split for p in wl.prompts} == {None}
    assert wl.max_new_tokens == 48 and wl.describe()["source"]["categories"] == ["chat-lines"]
    assert all(24 <= len(p.input_ids) <= 48 for p in wl.prompts)


def test_two_categories_alternate_and_every_prefix_has_equal_shares(compose_config, tokenizer):
    cfg = compose_config("+workload=it", "workload.categories=[summarise,qa]", "workload.num_prompts=40")
    assert cfg.workload.profile == "short"  # the tiny pair (a base model) gets the short profile
    wl = load_workload(cfg.workload, tokenizer)
    assert [p.category for p in wl.prompts] == ["summarise", "qa"] * 20
    assert wl.max_new_tokens == 32 and all(p.language == "it" for p in wl.prompts)  # the tiny pair's answer budget
    assert all(64 <= len(p.input_ids) <= 368 for p in wl.prompts)
    assert set(wl.describe()["prompt_tokens_by_category"]) == {"summarise", "qa"}
    again = load_workload(cfg.workload, tokenizer)  # seeded
    assert [p.id for p in again.prompts] == [p.id for p in wl.prompts]


def test_a_mix_interleaves_languages_and_categories(compose_config, tokenizer):
    cfg = compose_config("+workload=mix", "workload.categories=[chat-lines,code]", "workload.num_prompts=24")
    wl = load_workload(cfg.workload, tokenizer)
    rounds = [wl.prompts[i:i + 8] for i in range(0, 24, 8)]
    for row in rounds:
        assert [(p.language, p.category) for p in row] == list(itertools.product(["it", "en", "zh", "es"],
                                                                              ["chat-lines", "code"]))
    assert wl.max_new_tokens == 32  # a built category answers with its budget (the tiny pair's)
    unset = compose_config("+workload=mix", "workload.categories=[chat-lines,code]",
                           "workload.task_max_new_tokens=null")
    assert load_workload(unset.workload, tokenizer).max_new_tokens == 128  # null: the short profile's budget


def test_all_prompts_of_several_categories_keep_equal_shares(compose_config, tokenizer):
    cfg = compose_config("+workload=en", "workload.categories=[chat-lines,qa]", "workload.num_prompts=null")
    wl = load_workload(cfg.workload, tokenizer)
    assert Counter(p.category for p in wl.prompts) == {"chat-lines": 64, "qa": 64}  # chat lines cut to the 64 qa


def test_splits_and_bands_select(compose_config, tokenizer):
    cfg = compose_config("+workload=es", "workload.categories=[translate]", "workload.splits=[evaluate]",
                         "workload.task_prompt_tokens=[64,200]", "workload.num_prompts=null",
                         "workload.task_max_new_tokens=64")
    wl = load_workload(cfg.workload, tokenizer)
    assert {p.split for p in wl.prompts} == {"evaluate"} and 0 < len(wl.prompts) < 16
    assert all(64 <= len(p.input_ids) <= 200 for p in wl.prompts) and wl.max_new_tokens == 64


def test_multi_turn_prompts_render_every_turn(compose_config, templated):
    cfg = compose_config("+workload=en", "workload.categories=[chat]", "workload.profile=short",
                         "workload.task_prompt_tokens=[1,2000]", "workload.num_prompts=4")
    wl = load_workload(cfg.workload, templated)
    text = templated.decode(wl.prompts[0].input_ids)
    assert text.count("user:") >= 2 and text.count("assistant:") >= 2  # earlier turns, then the generation prompt


def test_models_config_chooses_the_profile(compose_config):
    assert compose_config("models=smollm2", "+workload=zh").workload.profile == "long"
    assert compose_config("+workload=zh").workload.profile == "short"


@pytest.mark.real_model
def test_smollm2_gets_long_prompts_as_recorded(compose_config):
    from workloads.build.categories import Lengths

    smollm2 = Lengths().smollm2
    cfg = compose_config("models=smollm2", "+workload=zh", "workload.categories=[chat,qa]", "workload.num_prompts=8")
    wl = load_workload(cfg.workload, smollm2)
    assert wl.max_new_tokens == 256 and all(200 <= len(p.input_ids) <= 1500 for p in wl.prompts)
    assert Counter(p.category for p in wl.prompts) == {"chat": 4, "qa": 4}


def test_a_multirun_sweeps_languages_and_category_lists(compose_config, tokenizer):
    parsed = OverridesParser.create().parse_overrides(["+workload=it,en", "workload.categories=[qa],[code]"])
    workloads, lists = (list(o.sweep_string_iterator()) for o in parsed)
    assert workloads == ["it", "en"] and lists == ["[qa]", "[code]"]
    for lang, chosen in itertools.product(workloads, lists):
        wl = load_workload(compose_config(f"+workload={lang}", f"workload.categories={chosen}").workload, tokenizer)
        assert {(p.language, p.category) for p in wl.prompts} == {(lang, chosen.strip("[]"))}


@pytest.mark.parametrize("overrides, message", [
    (["workload.categories=[sumarise]"],
     "workload.categories has 'sumarise', which is unknown: choose from chat-lines"),
    (["workload.categories=[]"], "workload.categories=[] is invalid"),
    (["workload.categories=[qa,qa]"], "names one twice"),
    (["workload.categories=[qa]", "workload.language=fr"], "workload.language has 'fr', which has no built categories"),
    (["workload.categories=[qa]", "workload.profile=medium"],
     "workload.profile='medium' is invalid: choose long or short"),
    (["workload.categories=[qa]", "workload.splits=[test]"], "workload.splits has 'test'"),
    (["workload.categories=[qa]", "workload.task_prompt_tokens=[2000,3000]"],
     "qa (en, profile short, splits ['train', 'select', 'evaluate']) yields no prompt in the band [2000, 3000]"),
    (["workload.categories=[qa]", "workload.task_max_new_tokens=0"], "workload.task_max_new_tokens=0 is invalid"),
    (["workload.path=/my/prompts.jsonl"], "workload.path='/my/prompts.jsonl' holds chat-line prompts, which "
     "workload.categories=['chat', 'summarise', 'qa', 'translate', 'rewrite', 'code'] does not read: add "
     "workload.categories=[chat-lines]"),
    (["workload.categories=[qa]", "workload.source=hf", "workload.path=someone/prompts"],
     "workload.source=hf gives chat-line prompts, which workload.categories=['qa'] does not read"),
])
def test_bad_selections_are_one_line_before_any_tokenizer(compose_config, tokenizer, overrides, message):
    cfg = compose_config("+workload=en", *overrides)
    with pytest.raises(SpectuneError, match=re.escape(message)) as err:
        check_workload(cfg.workload)  # no tokenizer, no model: what the front door runs first
    assert "\n" not in str(err.value)
    with pytest.raises(SpectuneError, match=re.escape(message)):
        load_workload(cfg.workload, tokenizer)


def test_the_cli_refuses_an_unknown_category_with_exit_2(cli, tmp_path):
    out = cli("+workload=en", "workload.categories=[sumarise]", run_dir=tmp_path / "run")
    assert out.returncode == 2
    assert "error: workload.categories has 'sumarise', which is unknown" in out.stderr + out.stdout
    assert not (tmp_path / "run" / "metadata.json").exists()
