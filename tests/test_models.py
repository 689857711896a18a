"""Loading the embedded pair through from_pretrained, and the pair check refusing real mismatches."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from spectune.errors import SpectuneError
from spectune.models.loading import REPO_ROOT, load_pair

TINY = {"name": "tiny", "target": {"name_or_path": "spectune/models/tiny/target", "revision": None},
        "draft": {"name_or_path": "spectune/models/tiny/draft", "revision": None}}
CPU = {"name": "cpu", "device": "cpu", "dtype": "float32", "attn_implementation": "sdpa", "compile": False,
       "threads": None}


def with_draft(path) -> dict:
    return {**TINY, "draft": {"name_or_path": str(path), "revision": None}}


def save_llama(path, tokenizer, vocab: int) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def test_pair_loads_offline_from_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the repo root, not the cwd
    pair = load_pair(TINY, CPU)
    assert type(pair.target).__name__ == type(pair.draft).__name__ == "LlamaForCausalLM"
    assert not pair.target.training and not pair.draft.training
    assert pair.target.dtype == pair.draft.dtype == torch.float32
    meta = pair.metadata
    assert meta["target"]["parameters"] > 4 * meta["draft"]["parameters"]
    assert meta["target"]["vocab_size"] == meta["draft"]["vocab_size"] == len(pair.tokenizer)
    assert len(meta["target"]["weights_sha256"]["model.safetensors"]) == 64
    assert meta["vocabulary_check"] == "passed"


def test_rejects_a_different_tokenizer(tmp_path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["a different little vocabulary for a different model"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    other = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    save_llama(tmp_path / "other", other, len(other))
    with pytest.raises(SpectuneError, match="model pair mismatch"):
        load_pair(with_draft(tmp_path / "other"), CPU)


def test_rejects_two_swapped_ids(tmp_path):
    """Same size, same tokens, but two ids swapped: every id must be the same event in both."""
    draft = tmp_path / "swapped"
    shutil.copytree(REPO_ROOT / "spectune/models/tiny/draft", draft)
    spec = json.loads((draft / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    a, b = "the", "Ġthe"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(SpectuneError, match="different ids"):
        load_pair(with_draft(draft), CPU)


def test_padded_lm_head_samples_over_the_tokenizer_ids(tmp_path):
    """Qwen-style padding: a draft with 64 extra LM-head rows is the same vocabulary (those rows are no
    token); the pair samples over the tokenizer's ids, and greedy speculative output equals AR's."""
    from spectune.engine import Engine, Request
    from spectune.engine.policy import FixedGamma
    from spectune.sampling import SamplingParams
    from spectune.sampling.rejection import get_sampler

    pair_tok = PreTrainedTokenizerFast.from_pretrained(str(REPO_ROOT / "spectune/models/tiny/draft"))
    save_llama(tmp_path / "padded", pair_tok, len(pair_tok) + 64)
    pair = load_pair(with_draft(tmp_path / "padded"), CPU)
    assert pair.vocab_size == len(pair_tok) == pair.metadata["sampling_vocab_size"]
    engine = Engine(pair.target, pair.draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", vocab_size=pair.vocab_size)
    requests = [Request(0, "p", "en", pair.tokenizer("Hello there, how are you?")["input_ids"], 12)]
    reference = engine.run(requests, None, 1).requests[0].output_ids
    assert engine.run(requests, FixedGamma(3), 1).requests[0].output_ids == reference
    assert max(reference) < len(pair_tok)


def test_rejects_a_tokenizer_larger_than_the_lm_head(tmp_path):
    pair_tok = PreTrainedTokenizerFast.from_pretrained(str(REPO_ROOT / "spectune/models/tiny/draft"))
    save_llama(tmp_path / "short", pair_tok, len(pair_tok) - 8)
    with pytest.raises(SpectuneError, match="LM-head rows"):
        load_pair(with_draft(tmp_path / "short"), CPU)


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_hub_name_offline_is_one_line(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = {"target": {"name_or_path": "double7/vicuna-68m-not-cached", "revision": None}, "draft": TINY["draft"]}
    with pytest.raises(SpectuneError, match="not in the local cache and the hub is unreachable") as err:
        load_pair(cfg, CPU)
    assert "\n" not in str(err.value)


def test_missing_local_directory_and_bad_dtype():
    with pytest.raises(SpectuneError, match="no such directory"):
        load_pair(with_draft("spectune/models/tiny/nope"), CPU)
    with pytest.raises(SpectuneError, match=r"hardware\.dtype"):
        load_pair(TINY, {**CPU, "dtype": "float8"})


def test_bfloat16_on_a_cpu_that_emulates_it_is_named_at_load(monkeypatch, caplog):
    """A CPU without avx512_bf16 / amx_bf16 runs bfloat16 emulated (measured on a 2-vCPU AMD EPYC VM: AR 21–23
    tok/s against ~40 with native bf16, and the grid switched speculation off): loading in bfloat16 there warns in
    one line, float32 does not, and the run's hardware metadata records what the CPU does."""
    import spectune.models.loading as loading
    from spectune.hardware import describe
    from spectune.placement import cpu_bf16

    assert cpu_bf16(frozenset({"avx2", "fma"})) == "emulated"
    assert cpu_bf16(frozenset({"avx512f", "avx512_bf16"})) == cpu_bf16(frozenset({"amx_bf16"})) == "native"
    assert cpu_bf16(frozenset()) == "unknown"  # no /proc/cpuinfo flags: say nothing
    monkeypatch.setattr(loading, "cpu_bf16", lambda: "emulated")  # this machine's CPU cannot be swapped
    with caplog.at_level("WARNING", logger="spectune.models.loading"):
        load_pair(TINY, CPU)
        assert not caplog.records
        load_pair(TINY, {**CPU, "dtype": "bfloat16"})
    (record,) = caplog.records
    assert "hardware.dtype=bfloat16" in record.getMessage() and "\n" not in record.getMessage()
    info = describe(OmegaConf.create({**CPU, "compile": None, "kv_cache": "dynamic", "max_cache_len": None,
                                      "compile_backend": "inductor"}), torch.device("cpu"))
    assert info["cpu_bf16"] == cpu_bf16() and info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_the_target_loads_alone_for_a_model_free_draft(tmp_path):
    """draft=False loads no draft (a draft whose tokenizer differs would be refused if it were loaded); the pair's
    draft and its metadata are None, the vocabulary is the target tokenizer's, and the target's head is still
    checked."""
    other = PreTrainedTokenizerFast.from_pretrained(str(REPO_ROOT / "spectune/models/tiny/draft"))
    save_llama(tmp_path / "short", other, len(other) - 8)  # a target head shorter than its tokenizer
    cfg = with_draft(tmp_path / "does-not-exist")
    pair = load_pair(cfg, CPU, draft=False)
    assert pair.draft is None and pair.metadata["draft"] is None
    assert pair.metadata["vocabulary_check"] == "target only"
    assert pair.vocab_size == len(pair.tokenizer) == pair.metadata["target"]["tokenizer_size"]
    with pytest.raises(SpectuneError, match="the target only"):
        load_pair({**TINY, "target": {"name_or_path": str(tmp_path / "short"), "revision": None}}, CPU, draft=False)


def test_a_model_free_proposer_runs_without_the_draft_model(compose_config):
    """open_setup with proposer=lookup or suffix: no draft model in the engine nor in the records (the metadata's
    models.draft is None); the default proposer in the same process still gets the pair's draft, and the two share
    the target. The configured proposer decides: proposer=model loads the draft."""
    from spectune.measure.models import load_models, needs_draft_model
    from workloads.setup import open_setup

    base = ["+workload=en", "workload.num_prompts=2", "workload.max_new_tokens=4"]
    free = {name: open_setup(compose_config(*base, f"proposer={name}"), "test") for name in ("lookup", "suffix")}
    model = open_setup(compose_config(*base), "test")
    for setup in free.values():
        assert setup.models.pair.draft is None and setup.metadata["models"]["draft"] is None
        assert setup.models.pair.target is model.models.pair.target
    assert model.models.pair.draft is not None and model.metadata["models"]["draft"]["name_or_path"]
    cfg = compose_config(*base)
    again = load_models(cfg.models, cfg.hardware, draft=False)
    assert again.pair.draft is None and again.pair.target is model.models.pair.target
    assert needs_draft_model(None) and needs_draft_model({"name": "model"})
    assert not needs_draft_model({"name": "lookup", "max_n": 3})
