"""The main job, ``python -m harness +workload=it``: real work (the six prompt categories, in the short profile on the
embedded tiny pair), a table broken down by category, and a log that a person can read with stderr in a file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter

import pytest

from spectune.run.progress import LOG_EVERY_S
from tests.conftest import REPO
from workloads.categories import CATEGORIES, CHAT_LINES
from workloads.loader import load_workload

OTHER_TASKS = ("tune", "coverage", "acceptance", "trace", "profile", "verify", "predict", "train", "evaluate")


@pytest.mark.parametrize("workload", ["it", "en", "zh", "es", "mix"])
def test_the_main_job_measures_the_six_categories_in_the_short_profile_on_the_tiny_pair(compose_config, workload):
    cfg = compose_config(f"+workload={workload}")
    assert cfg.task.name == "bench" and cfg.models.name == "tiny" and cfg.models.prompt_profile == "short"
    w = cfg.workload
    assert tuple(w.categories) == CATEGORIES and w.profile == "short"
    assert w.num_prompts % len(CATEGORIES) == 0 and w.num_prompts // len(CATEGORIES) >= 4  # a few units per category
    assert w.task_max_new_tokens == cfg.models.task_max_new_tokens < 128  # the pair's, not the profile's 128


def test_every_other_task_keeps_the_dialogue_lines(compose_config):
    """The other tasks (train and evaluate, which policies.train / policies.evaluate alias, included) keep the
    workload they had: 16 chat lines of up to 48 new tokens."""
    workloads = [compose_config(f"task={task}", "+workload=it").workload for task in OTHER_TASKS]
    for w in workloads:
        assert list(w.categories) == [CHAT_LINES] and w.num_prompts == 16 and w.max_new_tokens == 48


def test_the_main_jobs_prompts_hold_every_category_in_equal_shares(compose_config, tokenizer):
    cfg = compose_config("+workload=it")
    wl = load_workload(cfg.workload, tokenizer)
    each = cfg.workload.num_prompts // len(CATEGORIES)
    assert Counter(p.category for p in wl.prompts) == dict.fromkeys(CATEGORIES, each)
    assert [p.category for p in wl.prompts[:len(CATEGORIES)]] == list(CATEGORIES)  # interleaved: prefixes balanced
    assert wl.max_new_tokens == cfg.workload.task_max_new_tokens
    assert all(64 <= len(p.input_ids) <= 368 for p in wl.prompts)  # the short profile's band


@pytest.mark.slow(reason="the main job through the CLI (reduced: 12 prompts, 4 new tokens, 2 repeats, one γ)")
def test_the_main_job_logs_a_few_progress_lines_and_prints_the_table_by_category(tmp_path):
    """Stderr to a file, as in a batch job. 2 methods x 2 repeats x 12 prompts = 48 requests, each its own
    interleaved block (one prompt): a bar per block would be 48 bars. The run's one progress line writes at most
    10 + elapsed / LOG_EVERY_S lines (a line per tenth, 10% to 90%, one per LOG_EVERY_S seconds without one, the
    last), and no carriage return outside the model loader's own bars."""
    log = tmp_path / "stderr.log"
    run = tmp_path / "run"
    args = ["+workload=it", "workload.num_prompts=12", "workload.task_max_new_tokens=4", "task.repeats=2",
            "task.warmup=0", "gamma=[2]", f"hydra.run.dir={run}"]
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as err:
        proc = subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                              text=True, timeout=900, check=False)
    elapsed = time.monotonic() - start
    text = log.read_text(encoding="utf-8")
    assert proc.returncode == 0, text[-2000:]

    progress = [line for line in text.splitlines() if line.startswith("measuring:")]
    assert 1 <= len(progress) <= 10 + elapsed / LOG_EVERY_S, progress
    assert re.fullmatch(r"measuring: points 4/4, requests 48/48 \(100%\), elapsed \S+", progress[-1]), progress
    assert all("\r" not in line for line in text.splitlines() if not line.startswith("Loading weights")), text[-2000:]

    out = proc.stdout
    assert "per category (Spec-Bench style)" in out
    for category in CATEGORIES:  # one row per (method, category), each over its 2 prompts
        assert re.search(rf"^(ar|fixed:gamma=2)?\s+{category}\s+2\s", out, re.MULTILINE), (category, out[-3000:])
    summary = json.loads((run / "summary.json").read_text())
    assert {r["category"] for r in summary["by_category"]} == {*CATEGORIES, "all"}
