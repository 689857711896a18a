"""`task=tune`: the per-concurrency γ recommendation, its vLLM form, and bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from harness.tasks.tune import TuneSettings, _workload_cfgs
from spectune.engine.proposers import vllm_method
from spectune.errors import SpectuneError
from spectune.methods import Method
from spectune.run import cli
from spectune.vllm_export import VLLM_VERSION, VllmMethod, vllm_form, vllm_schedule
from tests.conftest import REPO

# every field of vLLM v0.34.0's SpeculativeConfig, read from its wheel (tests/data/engines/README.md)
VLLM_FIELDS = set((REPO / "tests" / "data" / "engines" / "vllm-speculative-config-fields.txt").read_text().split())


def test_vllm_schedule_covers_every_batch_size_from_1_and_merges_equal_k():
    assert vllm_schedule({1: 3, 4: 3, 8: 1}) == [[1, 4, 3], [5, 8, 1]]
    assert vllm_schedule({8: 0, 1: 4, 4: 2}) == [[1, 1, 4], [2, 4, 2], [5, 8, 0]]
    assert vllm_schedule({2: 5}) == [[1, 2, 5]]


def test_vllm_form_is_a_speculative_config_with_max_k_or_speculation_off():
    form = vllm_form({1: 4, 4: 2, 8: 0}, vllm_method(None, "org/draft"))
    config = form["speculative_config"]
    assert form["vllm_version"] == VLLM_VERSION and "dynamic_speculative_decoding" in form["docs"]
    assert config == {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": 4,
                      "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 4, 2], [5, 8, 0]]}
    assert json.loads(form["cli"].split("'")[1]) == config
    off = vllm_form({1: 0, 4: 0}, vllm_method(None, "org/draft"))
    assert off["speculative_config"] is None and "speculation off" in off["cli"]
    none = vllm_form({1: 4}, None)  # a proposer whose entry names no vLLM method
    assert none["speculative_config"] is None and "vLLM has no speculative method" in none["cli"]


@hypothesis_settings(derandomize=True, max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(1, 512), st.integers(0, 8), min_size=1, max_size=8))
def test_the_vllm_table_keeps_the_rules_vllm_0_34_checks(best_k):
    """vllm/v1/spec_decode/dynamic/utils.py (v0.34.0) accepts ranges that are positive, sorted, non-overlapping and
    start at 1, with K >= 0; every K <= num_speculative_tokens (the docs); each measured concurrency gets its K."""
    form = vllm_form(best_k, VllmMethod({"method": "draft_model", "model": "org/draft"}))
    if max(best_k.values()) == 0:
        assert form["speculative_config"] is None
        return
    config = form["speculative_config"]
    table = config["num_speculative_tokens_per_batch_size"]
    assert set(config) <= VLLM_FIELDS and table[0][0] == 1
    assert all(1 <= start <= end and k >= 0 for start, end, k in table)
    assert all(table[i + 1][0] == table[i][1] + 1 for i in range(len(table) - 1))
    assert config["num_speculative_tokens"] == max(k for _, _, k in table) > 0
    assert all(next(k for start, end, k in table if start <= c <= end) == best_k[c] for c in best_k)


@pytest.mark.parametrize(("proposer", "method"), [
    ({"name": "lookup", "max_n": 3, "min_n": 1},
     {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
    ({"name": "suffix", "max_tree_depth": 24, "max_gamma": None, "max_spec_factor": 1.0, "min_token_prob": 0.1,
      "adaptive": True, "corpus": "train"},
     {"method": "suffix", "suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_spec_factor": 1.0,
      "suffix_decoding_min_token_prob": 0.1}),
    ({"name": "suffix", "max_tree_depth": 16, "max_gamma": None, "max_spec_factor": 1.0, "min_token_prob": 0.3,
      "adaptive": False, "corpus": "none"},  # no cap by match length: a factor of the depth reaches every ceiling
     {"method": "suffix", "suffix_decoding_max_tree_depth": 16, "suffix_decoding_max_spec_factor": 16.0,
      "suffix_decoding_min_token_prob": 0.3}),
], ids=["lookup", "suffix", "suffix-not-adaptive"])
def test_a_model_free_drafts_vllm_form_names_vllms_method_and_its_settings(proposer, method):
    """A γ map tuned for prompt lookup or suffix decoding is exported as vLLM's ngram or suffix method with the
    measured settings, not as the pair's draft model; the notes say where vLLM's method differs."""
    form = vllm_form({1: 8, 4: 3}, vllm_method(proposer, "org/draft"))
    assert form["speculative_config"] == {**method, "num_speculative_tokens": 8,
                                          "num_speculative_tokens_per_batch_size": [[1, 1, 8], [2, 4, 3]]}
    assert json.loads(form["cli"].split("'")[1]) == form["speculative_config"]
    assert set(form["speculative_config"]) <= VLLM_FIELDS
    assert any(repr(method["method"]) in note for note in form["notes"])
    if method["method"] == "suffix":
        assert any(f"proposer.corpus={proposer['corpus']}" in note for note in form["notes"])


@pytest.mark.parametrize(("max_gamma", "depth", "want"), [(None, 24, [[1, 1, 24], [2, 4, 3]]),
                                                       (6, 24, [[1, 1, 6], [2, 4, 3]]),
                                                       (None, 3, [[1, 4, 3]])])
def test_suffix_decodings_vllm_form_caps_k_at_the_chain_ceiling_that_ran(max_gamma, depth, want):
    """A grid's γ 32 drafted at most the proposer's ceiling (max_gamma, else the tries' depth): vLLM gets the
    ceiling; equal K of adjacent concurrencies merge after the cap."""
    proposer = {"name": "suffix", "max_tree_depth": depth, "max_gamma": max_gamma, "max_spec_factor": 1.0,
                "min_token_prob": 0.1, "adaptive": True, "corpus": "train"}
    config = vllm_form({1: 32, 4: 3}, vllm_method(proposer, "org/draft"))["speculative_config"]
    assert config["num_speculative_tokens_per_batch_size"] == want
    assert config["num_speculative_tokens"] == max(k for _, _, k in want)


def test_the_recommendation_exports_the_proposer_the_run_measured(compose_config):
    """task=tune's recommendation passes the run's proposer to the vLLM form: a γ map tuned with proposer=lookup is
    vLLM's ngram method at the run's n-gram lengths, one tuned with the draft model is draft_model."""
    from harness.tasks.tune import recommend

    cfg = compose_config("task=tune", "+workload=en", "proposer=lookup", "proposer.max_n=4")
    settings = TuneSettings.from_cfg(cfg)
    methods = [{"method": "ar", "gamma": 0}, {"method": "fixed:gamma=3", "gamma": 3, "speedup": 1.5}]
    ranking = {"output_throughput": {"best": "fixed:gamma=3", "indistinguishable": [], "mad_pick": None,
                                     "statistics": {}, "noise_floor_pct": None}}
    cells = [{"language": "en", "workload": "en", "concurrency": 1, "methods": methods, "ranking": ranking}]
    for proposer, expected in (("lookup", {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 1}),
                               ("model", {"method": "draft_model", "model": "org/draft"})):
        config = OmegaConf.to_container(cfg if proposer == "lookup" else compose_config("task=tune", "+workload=en"),
                                        resolve=True)
        models = {"draft": None if proposer == "lookup" else {"name_or_path": "org/draft"}}  # lookup loads none
        rec = recommend(cells, settings, models, {"config": config})
        assert rec["vllm"]["en"]["speculative_config"] == {**expected, "num_speculative_tokens": 3,
                                                            "num_speculative_tokens_per_batch_size": [[1, 1, 3]]}


@pytest.mark.parametrize(("override", "names"), [
    ("task.repeats=0", "task.repeats=0"),
    ("task.concurrency=[]", "task.concurrency=[]"),
    ("gamma=[]", "gamma=[]"),
    ("slo.ttft_ms=0", "slo.ttft_ms=0"),
    ("slo.tpot_ms=-3", "slo.tpot_ms=-3"),
    ("task.concurrency=[1,0]", "task.concurrency=0"),
    ("policy=hf-heuristic", "policy=hf-heuristic"),
    ("task.languages=[it,xx]", "task.languages"),
    ("task.block_prompts=2", "task.block_prompts=2"),  # the default concurrencies [1, 4, 8]: not a multiple of 4
    ("task.block_prompts=0", "task.block_prompts=0"),
    ("task.noise_floor=maybe", "task.noise_floor"),
    ("task.validate_prompts=0", "task.validate_prompts=0"),
    ("task.validate_prompts=-8", "task.validate_prompts=-8"),
    ("task.validate_prompts=12", "task.validate_prompts=12"),  # concurrency 8's unit is 8 prompts: 12 is not whole
    ("task.validate_prompts=2.5", "task.validate_prompts"),
    ("task.validate_prompts=many", "task.validate_prompts"),
])
def test_tune_bad_input_is_rejected_before_any_model_loads(compose_config, override, names):
    """A value of the wrong type fails as Hydra composes (the schema, restated by the front door's check), a bad
    range or rule in TuneSettings.from_cfg: one line naming the key either way."""
    overrides = ["task=tune", "+workload=en", override]
    with pytest.raises(SpectuneError) as err:
        cli.check_keys_exist(overrides)
        TuneSettings.from_cfg(compose_config(*overrides))
    assert names in str(err.value) and "\n" not in str(err.value)


def test_languages_run_the_same_workload_settings_on_each_bundled_set(compose_config):
    cfg = compose_config("task=tune", "+workload=it", "workload.num_prompts=5", "task.languages=[en,zh]")
    settings = TuneSettings.from_cfg(cfg)
    assert settings.languages == ("en", "zh") and settings.gammas == (1, 2, 3, 4, 6)
    nodes = _workload_cfgs(cfg, settings.languages)
    assert [(n.name, n.language, n.path, n.num_prompts) for n in nodes] == [
        ("en", "en", "workloads/prompts/en.jsonl", 5), ("zh", "zh", "workloads/prompts/zh.jsonl", 5)]
    assert _workload_cfgs(cfg, None) == [cfg.workload]


def test_tune_bad_input_is_one_line_and_writes_nothing(harness_in_process, tmp_path):
    """Through the front door's checks and the task, in process (the process's exit 2: tests/test_cli.py)."""
    with pytest.raises(SpectuneError, match=r"task\.repeats=0") as err:
        harness_in_process(tmp_path / "run", "task=tune", "+workload=en", "task.repeats=0")
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


@pytest.mark.slow(reason="task=tune runs a grid per concurrency through the CLI")
def test_tune_end_to_end_tiny_writes_a_recommendation_per_concurrency(cli, tmp_path):
    proc = cli("task=tune", "+workload=en", "workload.num_prompts=2", "workload.max_new_tokens=6", "task.warmup=0",
               "task.concurrency=[1,2]", "gamma=[1,2]", "task.repeats=2", "slo.e2el_ms=100000", "slo.ttft_ms=60000",
               f"hydra.run.dir={tmp_path}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Recommendation" in proc.stdout and "--speculative-config" in proc.stdout

    rec = json.loads((tmp_path / "recommendation.json").read_text())
    assert rec["chosen_by"] == "request_goodput" and rec["slo"] == {"ttft_ms": 60000.0, "e2el_ms": 100000.0}
    assert rec["gammas"] == [0, 1, 2] and "only for the measured" in rec["scope"]
    assert [r["concurrency"] for r in rec["recommendations"]] == [1, 2]
    for row in rec["recommendations"]:
        assert row["status"] == "ok" and row["best_gamma"] in (0, 1, 2)
        assert row["best_gamma"] in row["indistinguishable_gammas"]
        # units: the 2 prompts at concurrency 1 (each with its 2 repeats), one block of 2 at concurrency 2
        assert row["statistics"]["n_units"] == (2 if row["concurrency"] == 1 else 1)
        assert row["request_goodput_ratio_ci95_lo"] <= row["request_goodput_ratio_ci95_hi"]
    assert rec["metadata"]["models"]["draft"]["parameters"] > 0 and rec["metadata"]["git"]["commit"]
    schedule = rec["vllm"]["en"]["speculative_config"]
    if schedule is not None:
        assert schedule["num_speculative_tokens_per_batch_size"][0][0] == 1

    summary = json.loads((tmp_path / "summary.json").read_text())
    cell = summary["cells"][0]
    order = [(p["method"], p["repeat"]) for p in cell["points"]]
    assert order == [("ar", 0), ("fixed:gamma=1", 0), ("fixed:gamma=2", 0),
                     ("fixed:gamma=1", 1), ("fixed:gamma=2", 1), ("ar", 1)]  # rotated per repeat
    g2 = {m["method"]: m for m in cell["methods"]}["fixed:gamma=2"]
    assert g2["repeats"] == 2 and g2["output_throughput_ci95_lo"] <= g2["output_throughput_ci95_hi"]
    assert g2["request_goodput"] > 0 and g2["slo_p99_ttft_ms_pass"] is True
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert set(requests["concurrency"]) == {1, 2} and set(requests["repeat"]) == {0, 1}
    assert len(requests) == 2 * 3 * 2 * 2  # concurrencies x methods x repeats x prompts


def test_interleaved_tune_runs_every_method_per_block_and_measures_its_noise_floor(harness_in_process, tmp_path):
    """task.block_prompts=2 with task.noise_floor=true on the embedded pair, in process: each (method, repeat) is one
    point merged from its two blocks (all four prompts, every cycle), the A/A row runs beside AR but is never a
    candidate γ, and each cell carries its noise floor into the recommendation."""
    code = harness_in_process(tmp_path / "run", "task=tune", "+workload=en", "workload.num_prompts=4",
                              "workload.max_new_tokens=4", "task.warmup=0", "task.concurrency=[1,2]", "gamma=[1]",
                              "task.repeats=1", "task.block_prompts=2", "task.noise_floor=true")
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for cell in summary["cells"]:
        assert sorted(p["method"] for p in cell["points"]) == ["ar", "ar#2", "fixed:gamma=1"]
        assert all(p["status"] == "ok" for p in cell["points"])
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    per_point = requests.groupby(["concurrency", "method"])["prompt_id"].nunique()
    assert (per_point == 4).all() and len(per_point) == 2 * 3  # both blocks merged into every point
    rec = json.loads((tmp_path / "run" / "recommendation.json").read_text())
    for row in rec["recommendations"]:
        assert row["status"] == "ok" and row["best_gamma"] in (0, 1) and row["noise_floor_pct"] is not None


def test_validation_needs_prompts_the_grid_leaves(compose_config, harness_in_process, tmp_path):
    """A grid over every prompt (workload.num_prompts=null) leaves none fresh: one line before any model loads; more
    fresh prompts than the workload has after the grid's: one line before anything is measured or written."""
    with pytest.raises(SpectuneError, match=r"task\.validate_prompts=16 .*workload\.num_prompts=null") as err:
        TuneSettings.from_cfg(compose_config("task=tune", "+workload=en", "workload.num_prompts=null",
                                             "task.validate_prompts=16"))
    assert "\n" not in str(err.value)
    with pytest.raises(SpectuneError, match=r"task\.validate_prompts=100000 .* prompts left after the grid's 2") as err:
        harness_in_process(tmp_path / "run", "task=tune", "+workload=en", "workload.num_prompts=2",
                           "task.concurrency=[1]", "task.validate_prompts=100000")
    assert "\n" not in str(err.value) and not (tmp_path / "run" / "summary.json").exists()


def test_the_maps_gamma_is_validated_against_ar_on_prompts_the_grid_never_saw(compose_config, tmp_path):
    """validate_map on the embedded pair, its cells forced (γ 2 at concurrency 1, γ 1 at 2, γ 0 at 4, a failed grid
    at 8) so that every branch runs whatever a grid would pick: each speculative cell runs AR and the map's γ, one
    repeat, on the 4 prompts after the grid's 2 (disjoint: the file's prompt ids), and reports its speed-up, interval
    and outcome."""
    from harness.tasks.tune import fresh_prompts_after, validate_map
    from policies.registry import make_policy
    from spectune.engines.spectune import SpectuneEngine
    from spectune.measure.confirm import FASTER, SLOWER, UNRESOLVED
    from workloads.loader import load_workload
    from workloads.setup import engine_of, models_of

    cfg = compose_config("task=tune", "+workload=en", "workload.num_prompts=2", "workload.max_new_tokens=4",
                         "task.warmup=0", "task.concurrency=[1,2]", "gamma=[1,2]", "task.repeats=1",
                         "task.validate_prompts=4")
    settings = TuneSettings.from_cfg(cfg)
    models = models_of(cfg)
    workload = load_workload(cfg.workload, models.tokenizer)
    fresh = fresh_prompts_after(cfg.workload, workload, 4, models.tokenizer)
    grid_ids, fresh_ids = [p.id for p in workload.prompts], [p.id for p in fresh]
    assert len(fresh_ids) == 4 and not set(grid_ids) & set(fresh_ids)
    policy = OmegaConf.to_container(cfg.policy, resolve=True)
    inner = engine_of(cfg, models, workload.sampling)
    rows = [{"language": "en", "workload": "en", "concurrency": c, "status": "ok", "best_gamma": g,
             "best_method": Method.fixed(g).label}
            for c, g in ((1, 2), (2, 1), (4, 0))]  # the γ 0 row is never measured, so no grid at 4 is needed
    rows.append({"language": "en", "workload": "en", "concurrency": 8, "status": "failed", "best_gamma": None})
    out = validate_map(rows, settings, policy, {"en": workload}, {"en": fresh},
                       lambda w, c: SpectuneEngine(inner, lambda m: make_policy(policy, m.gamma), models.max_context),
                       models.max_context, tmp_path)
    assert out["prompts"] == 4 and out["repeats"] == 1 and out["against"] == "ar"
    by_c = {cell["concurrency"]: cell for cell in out["cells"]}
    assert by_c[4]["status"].startswith("speculation off") and by_c[4]["held"] is None
    assert by_c[8]["status"] == "grid failed" and by_c[8]["held"] is None
    assert sorted(p.name for p in (tmp_path / "validate").iterdir()) == ["en_c1", "en_c2"]
    for c, gamma in ((1, 2), (2, 1)):
        cell = by_c[c]
        assert cell["status"] == "ok" and cell["gamma"] == gamma and cell["prompts"] == 4
        assert cell["speedup_ci95_lo"] <= cell["speedup"] <= cell["speedup_ci95_hi"]
        assert cell["held"] in (FASTER, UNRESOLVED, SLOWER) and cell["speedup_verdict"]
        requests = pd.read_parquet(tmp_path / "validate" / f"en_c{c}" / "requests.parquet")
        assert set(requests["method"]) == {"ar", f"fixed:gamma={gamma}"}
        assert sorted(set(requests["prompt_id"])) == sorted(fresh_ids)
        summary = json.loads((tmp_path / "validate" / f"en_c{c}" / "summary.json").read_text())
        assert summary["validation"]["held"] == cell["held"]


def test_tune_with_validation_writes_it_into_the_recommendation(harness_in_process, tmp_path, caplog):
    """Through the task: recommendation.json gains a validation cell per concurrency (the map's γ, its outcome) and
    the printed table; the validation runs' prompts are none of the grid's."""
    import logging

    caplog.set_level(logging.INFO)
    code = harness_in_process(tmp_path / "run", "task=tune", "+workload=en", "workload.num_prompts=2",
                              "workload.max_new_tokens=4", "task.warmup=0", "task.concurrency=[1,2]", "gamma=[1]",
                              "task.repeats=1", "task.validate_prompts=4")
    assert code == 0
    run = tmp_path / "run"
    rec = json.loads((run / "recommendation.json").read_text())
    cells = rec["validation"]["cells"]
    assert [c["concurrency"] for c in cells] == [1, 2] and rec["validation"]["prompts"] == 4
    grid_ids = set(pd.read_parquet(run / "requests.parquet")["prompt_id"])
    for cell, row in zip(cells, rec["recommendations"], strict=True):
        assert cell["gamma"] == row["best_gamma"]
        if cell["status"] == "ok":
            where = run / "validate" / f"en_c{cell['concurrency']}"
            ids = set(pd.read_parquet(where / "requests.parquet")["prompt_id"])
            assert len(ids) == 4 and not ids & grid_ids
    assert "Validation of the map on 4 fresh prompts" in caplog.text
