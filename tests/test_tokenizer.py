"""The embedded tokenizer: lossless in all four languages, and Chinese does not explode into bytes."""

from __future__ import annotations

import pytest

from spectune.models.loading import REPO_ROOT

TEXTS = {
    "it": "Perché l'acqua è così fredda? Più tardi andremo al caffè, però senza fretta.",
    "en": "The quick brown fox doesn't jump over 13 lazy dogs; it naps instead.",
    "zh": "今天天气很好，我们一起去公园散步吧。你喜欢读什么书？",
    "es": "¿Dónde está la estación? Mañana comeremos paella con el niño y la señora.",
}




@pytest.mark.parametrize("lang", sorted(TEXTS))
def test_round_trip(tokenizer, lang):
    text = TEXTS[lang]
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids  # byte-level: nothing unknown


def test_chinese_tokens_per_character_is_bounded(tokenizer):
    per_char = {lang: len(tokenizer(t, add_special_tokens=False)["input_ids"]) / len(t) for lang, t in TEXTS.items()}
    assert per_char["zh"] < 1.2  # a byte fallback would cost ~3 tokens per character
    assert all(v < 0.6 for lang, v in per_char.items() if lang != "zh")


def test_both_models_ship_the_same_tokenizer_files():
    base = REPO_ROOT / "spectune/models/tiny"
    assert (base / "target/tokenizer.json").read_bytes() == (base / "draft/tokenizer.json").read_bytes()
