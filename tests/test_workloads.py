"""Workload configs compose through Hydra, load ≥ 100 prompts, and bad input fails in one line."""

from __future__ import annotations

import json
import re

import pytest
from hydra import compose, initialize_config_dir

from spectune.errors import SpectuneError
from spectune.models.loading import REPO_ROOT
from spectune.run import cli
from workloads.loader import load_workload

LANGS = ("it", "en", "zh", "es")




def composed(*overrides: str):
    """The bundled chat-line files (``workload.categories=[chat-lines]``: the main job's default is the built
    categories)."""
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=["workload.categories=[chat-lines]", *overrides])


@pytest.mark.parametrize("lang", LANGS)
def test_bundled_workload_composes_and_loads_100(tokenizer, lang):
    cfg = composed(f"+workload={lang}", "workload.num_prompts=100")
    wl = load_workload(cfg.workload, tokenizer)
    assert wl.language == lang and len(wl.prompts) == 100
    assert len({p.id for p in wl.prompts}) == 100
    desc = wl.describe()["prompt_tokens"]
    assert 24 <= desc["min"] <= desc["p50"] <= desc["max"] <= 48
    assert wl.prompts[0].input_ids == tokenizer(wl.prompts[0].text)["input_ids"]
    default = load_workload(composed(f"+workload={lang}").workload, tokenizer)
    assert default.prompts == wl.prompts[: len(default.prompts)]  # first N of the same seeded order


def test_mix_interleaves_languages(tokenizer):
    wl = load_workload(composed("+workload=mix", "workload.num_prompts=8").workload, tokenizer)
    assert [p.language for p in wl.prompts] == list(LANGS) * 2
    assert set(wl.describe()["prompt_tokens_by_language"]) == set(LANGS)


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_malformed_line_names_file_and_line(tmp_path, tokenizer):
    bad = write(tmp_path / "bad.jsonl", [json.dumps({"id": "a", "prompt": "fine"}), "{not json", "{}"])
    cfg = composed("+workload=en", f"workload.path={bad}")
    with pytest.raises(SpectuneError, match=rf"{bad}:2: malformed JSON"):
        load_workload(cfg.workload, tokenizer)
    missing_field = write(tmp_path / "nofield.jsonl", [json.dumps({"text": "no prompt key"})])
    with pytest.raises(SpectuneError, match=rf"{missing_field}:1: expected an object"):
        load_workload(composed("+workload=en", f"workload.path={missing_field}").workload, tokenizer)


def test_user_jsonl_path(tmp_path, tokenizer, monkeypatch):
    rows = [json.dumps({"prompt": f"User prompt number {i}: tell me a story."}) for i in range(5)]
    write(tmp_path / "mine.jsonl", rows)
    monkeypatch.chdir(tmp_path)  # relative user paths resolve against the current directory first
    cfg = composed("+workload=en", "workload.path=mine.jsonl", "workload.num_prompts=5", "workload.prompt_tokens=null")
    wl = load_workload(cfg.workload, tokenizer)
    assert len(wl.prompts) == 5 and {p.text for p in wl.prompts} == {json.loads(r)["prompt"] for r in rows}
    assert wl.describe()["source"]["path"] == str(tmp_path / "mine.jsonl")


@pytest.mark.parametrize("override, message", [
    ("workload.num_prompts=0", "num_prompts=0 is invalid"),
    ("workload.num_prompts=abc", "num_prompts='abc' is invalid"),
    ("workload.num_prompts=100000", "only"),
    ("workload.max_new_tokens=-1", "max_new_tokens=-1"),
    ("workload.sampling.temperature=-1", "temperature"),
    ("workload.source=ftp", "workload.source='ftp'"),
    ("workload.path=/no/such/file.jsonl", "no such file"),
    ("workload.prompt_tokens=[48,24]", "prompt_tokens"),
])
def test_bad_values_are_one_line_errors(tokenizer, override, message):
    """A value of the wrong type fails as Hydra composes (the schema, restated by the front door's check), a bad
    value of the right type as the loader reads it: one line either way."""
    overrides = ["+workload=en", override]
    with pytest.raises(SpectuneError, match=re.escape(message)) as err:
        cli.check_keys_exist(overrides)
        load_workload(composed(*overrides).workload, tokenizer)
    assert "\n" not in str(err.value)


def test_hf_source_offline_is_one_line(tokenizer, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: unreachable at once
    cfg = composed("+workload=en", "workload.source=hf", "workload.path=someone/prompts", "workload.split=test")
    with pytest.raises(SpectuneError, match="cannot load dataset 'someone/prompts': the hub is unreachable"):
        load_workload(cfg.workload, tokenizer)


def test_bundled_prompts_do_not_overlap_each_other():
    for lang in LANGS:
        rows = [json.loads(x) for x in (REPO_ROOT / f"workloads/prompts/{lang}.jsonl").read_text().splitlines()]
        assert len(rows) >= 100 and len({r["prompt"] for r in rows}) == len(rows)


def test_the_build_scripts_read_and_write_where_the_repo_keeps_things():
    """The corpus builder writes where the tiny-pair trainer and the feature-draft trainer read (an ignored folder:
    GPL text is never committed); the prompt-set builder's defaults are the tiny tokenizer and the committed sets."""
    import subprocess

    from spectune.models import train_tiny
    from workloads.build import corpus, prompts

    assert corpus.CORPUS_DIR == train_tiny.CORPUS == REPO_ROOT / "workloads" / "corpus"
    ignored = subprocess.run(["git", "check-ignore", "-q", "workloads/corpus/en.train.txt"], cwd=REPO_ROOT)
    assert ignored.returncode == 0
    assert prompts.WORKLOADS / "corpus" == corpus.CORPUS_DIR
    assert (prompts.ROOT / "spectune" / "models" / "tiny" / "target" / "config.json").is_file()
    assert {p.name for p in (prompts.WORKLOADS / "prompts").glob("*.jsonl")} >= {"en.jsonl", "it.jsonl", "zh.jsonl",
                                                                                  "es.jsonl"}
