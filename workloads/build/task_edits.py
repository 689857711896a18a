"""Seeded spelling errors injected into a real passage, for the proofreading prompts of the rewrite task.

Alphabetic text (it, en, es): about one word in 25 of five letters or more gets one typo (two neighbouring
inner letters swapped, an inner letter dropped, or one doubled). Chinese: about one character in 40 is swapped
with its neighbour (both Han characters, different), the commonest slip when typing. Every change is returned
as ``[original, corrupted]`` so that a later score can check the corrections.
"""

from __future__ import annotations

import random
import re

_WORD = re.compile(r"\b[^\W\d_]{5,}\b")
_HAN = re.compile(r"[\u4e00-\u9fff]{2}")


def _typo(word: str, rng: random.Random) -> str:
    kind = rng.randrange(3)
    j = rng.randrange(1, len(word) - 2)  # inner letters only: the first and the last stay
    if kind == 0 and word[j] != word[j + 1]:
        return word[:j] + word[j + 1] + word[j] + word[j + 2:]
    if kind == 1:
        return word[:j] + word[j + 1:]
    return word[:j] + word[j] + word[j:]


def corrupt(text: str, lang: str, rng: random.Random) -> tuple[str, list[list[str]]]:
    """``text`` with injected errors, and the list of ``[original, corrupted]`` pairs, in text order."""
    if lang == "zh":
        spans = [m.span() for m in _HAN.finditer(text) if m.group()[0] != m.group()[1]]
        rate = 20  # a pair of characters in 20 = one character in 40
    else:
        spans = [m.span() for m in _WORD.finditer(text)]
        rate = 25
    if not spans:
        return text, []
    chosen = sorted(rng.sample(spans, max(1, len(spans) // rate)))
    out, changes, last = [], [], 0
    for start, end in chosen:
        if start < last:
            continue  # overlapping Chinese pairs: keep the first
        original = text[start:end]
        bad = original[::-1] if lang == "zh" else _typo(original, rng)
        out += [text[last:start], bad]
        changes.append([original, bad])
        last = end
    out.append(text[last:])
    return "".join(out), changes
