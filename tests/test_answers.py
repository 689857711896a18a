"""workloads.answers describes what the target answered: finish reason, output language, repetition, length."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from tests.conftest import REPO
from workloads import answers


def test_finish_reason_tells_stop_from_length():
    assert answers.finish_reason([5, 6, 2], 8, [2]) == "stop"
    assert answers.finish_reason([5, 6, 7], 3, [2]) == "length"
    assert answers.finish_reason([2], 3, [2]) == "stop"  # an immediate stop is a stop
    assert answers.finish_reason([], 3, [2]) == "other"


def test_repetition_rate_counts_repeated_four_grams():
    assert answers.repetition_rate([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)
    assert answers.repetition_rate(list(range(50))) == 0.0
    assert answers.repetition_rate([7] * 50) == pytest.approx(46 / 47)
    assert answers.repetition_rate([1, 2]) == 0.0


@pytest.mark.parametrize("lang", ["it", "en", "zh", "es"])
def test_output_language_recognises_the_handbook_in_its_language(lang):
    rows = [json.loads(x) for x in (REPO / f"workloads/tasks/{lang}.jsonl").read_text(encoding="utf-8").splitlines()]
    passages = [r["prompt"].split("\n\n", 1)[1] for r in rows if r["task"] == "summarise"]
    found = Counter(answers.output_language(p) for p in passages)
    assert found[lang] >= 0.9 * len(passages), found
    assert answers.output_language("1234 !!") == "unknown"


def test_describe_answers_names_the_task_and_the_translation_target(tokenizer):
    index = answers.category_index(["it"])
    translate = next(r for r in index.values() if r["task"] == "translate")
    eos = tokenizer.eos_token_id
    text_ids = tokenizer("the cat is on the table and the dog is in the garden")["input_ids"][1:]
    requests = pd.DataFrame([
        {"prompt_id": translate["id"], "language": "it", "output_ids": [*text_ids, eos]},
        {"prompt_id": "it-food-0001", "language": "it", "output_ids": [9] * 8},
    ])
    out = answers.describe_answers(requests, tokenizer.decode, [eos], 8, index)
    assert out.category.tolist() == ["translate", "chat-lines"]
    assert out.finish.tolist() == ["stop", "length"]
    assert out.expected_language.tolist() == [translate["target_language"], "it"]
    assert out.output_language[0] == "en" and out.repetition[1] == pytest.approx(4 / 5)
    table = answers.by_category(out)
    assert table.loc[("it", "translate"), "stop"] == 1.0 and table.loc[("it", "chat-lines"), "length"] == 1.0


def test_the_cli_reads_a_committed_run(tiny_sweep, tmp_path, capsys):
    out = tmp_path / "answers.csv"
    assert answers.main([str(tiny_sweep / "0"), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert len(table) == 3 and set(table.category) == {"chat-lines"}
    assert set(table.finish) <= {"stop", "length"}
    assert answers.main([str(tiny_sweep / "0"), "--method", "nope"]) == 2
    assert "--method 'nope' has no requests" in capsys.readouterr().err
