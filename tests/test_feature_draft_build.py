"""A draft that reads the target's features, through the applications: its trainer's batches, task=acceptance and
task=bench (Hydra composition and the models config, as a user runs them)."""

from __future__ import annotations

import pytest
import torch

from spectune.engine.features import HiddenTap
from spectune.models import feature_draft
from tests.test_feature_draft import VOCAB


@pytest.fixture(scope="module")
def tiny_feature_draft_dir(tmp_path_factory):
    """A random 1-layer feature draft for the embedded tiny target, stored as the loader reads it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.conftest import REPO

    source = REPO / "spectune/models/tiny/target"
    target = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("feature_draft") / "draft"
    feature_draft.build(target, 1, torch.arange(target.config.vocab_size)).save(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def test_acceptance_task_reports_alpha_by_draft_step_for_a_feature_draft(harness_in_process, tiny_feature_draft_dir,
                                                                         tmp_path):
    """task=acceptance loads the feature draft through the models config (attached to the target) and reports α per
    draft step; α at step 1 is the headline α."""
    import json

    run = tmp_path / "run"
    assert harness_in_process(run, "task=acceptance", "+workload=en", "workload.num_prompts=2",
                              "workload.max_new_tokens=6", f"models.draft.name_or_path={tiny_feature_draft_dir}",
                              "task.feature_max_gamma=3") == 0
    result = json.loads((run / "acceptance.json").read_text())
    assert result["draft_reads_target_features"] is True
    assert len(result["alpha_by_draft_step"]) == 3
    assert result["alpha"] == pytest.approx(result["alpha_by_draft_step"][0])
    assert result["models"]["draft"]["reads_target_features"] is True
    assert result["timing"]["steps_timed"]["draft"] > 0


def test_bench_runs_a_feature_draft_and_refuses_the_static_path(harness_in_process, tiny_feature_draft_dir, tmp_path):
    from spectune.errors import SpectuneError
    from tests.conftest import SMALL_BENCH

    draft = f"models.draft.name_or_path={tiny_feature_draft_dir}"
    assert harness_in_process(tmp_path / "bench", *SMALL_BENCH, draft, "gamma=[2]") == 0
    with pytest.raises(SpectuneError, match="static"):
        harness_in_process(tmp_path / "static", *SMALL_BENCH, draft, "gamma=[2]", "hardware=cpu-static")
    assert not (tmp_path / "static" / "results.parquet").exists()


def _sequence(target, prompt: list[int], continuation: list[int], top_k: int = 8):
    """A teacher Sequence as the sampler stores it: the target's features at every position but the last and its
    top-k law at every continuation step."""
    from workloads.build.teacher_data import Sequence

    tap = HiddenTap.on(target)
    with torch.no_grad():
        logits = target(torch.tensor([prompt + continuation])).logits[0]
    laws = torch.softmax(logits[len(prompt) - 1: -1].float(), -1)
    probs, ids = laws.topk(top_k, -1)
    return Sequence("en", prompt, continuation, ids.int(), probs.half(), tap.last[0, :-1].clone())


def test_training_batches_align_entries_features_and_teacher_laws(feature_pair):
    """batch_tensors: column c holds token x_{c+1} with the target's f_c; next_features: its goal f_{c+1}; and the
    continuation columns are those whose goal feature, through the target's head, gives the stored teacher law."""
    from workloads.build import train_feature_draft as T

    target, _ = feature_pair
    gen = torch.Generator().manual_seed(1)
    batch = [_sequence(target, torch.randint(0, VOCAB, (p,), generator=gen).tolist(),
                       torch.randint(0, VOCAB, (c,), generator=gen).tolist()) for p, c in ((7, 5), (4, 9))]
    ids, feats, mask = T.batch_tensors(batch, pad=0)
    goal = T.next_features(batch, ids.shape[1])
    for r, s in enumerate(batch):
        seq = s.prompt + s.continuation
        n = len(seq) - 2
        assert mask[r].sum() == n and ids[r, :n].tolist() == seq[1:-1]
        assert torch.equal(feats[r, :n], s.features[:n].float())
        assert torch.equal(goal[r, :n], s.features[1:n + 1].float())
    for (r, first, count), s in zip(T.continuation_rows(batch), batch, strict=True):
        law = torch.softmax(target.lm_head(goal[r, first: first + count].double()).float(), -1)
        assert torch.equal(law.topk(8, -1).indices.int(), s.top_ids)


def test_argmax_terms_score_the_drafts_argmax_against_the_teachers(feature_pair):
    """losses_of's ``top1`` is 1 exactly where the draft's argmax over all target ids (the engine's scattered
    logits, q = 0 outside its 48 ids) is the teacher's argmax, and ``argmax_ce`` is −log q of the teacher's argmax
    there (0 where that id is outside the draft's vocabulary: no row can learn it)."""
    from spectune.models import draft_vocab
    from workloads.build import train_feature_draft as T

    target, draft = feature_pair
    gen = torch.Generator().manual_seed(3)
    batch = [_sequence(target, torch.randint(0, VOCAB, (p,), generator=gen).tolist(),
                       torch.randint(0, VOCAB, (c,), generator=gen).tolist()) for p, c in ((6, 40), (5, 33))]
    ids, feats, mask = T.batch_tensors(batch, pad=0)
    rows = draft.lm_head.draft_to_target.numel()
    t2d = draft_vocab.target_to_draft_map(draft.lm_head.draft_to_target, VOCAB)
    with torch.no_grad():
        hidden = feature_draft.unrolled(draft, ids, feats.double(), mask, 1)[0]
        out = T.losses_of(draft, batch, hidden, t2d, rows, None)
        full = draft(ids, feats.double(), attention_mask=mask).logits  # over all target ids
    law = torch.cat([torch.log_softmax(full[r, a: a + n].double(), -1) for r, a, n in T.continuation_rows(batch)])
    best = torch.cat([s.top_ids[:, 0].long() for s in batch])
    inside = best < rows  # the fixture's draft vocabulary is target ids 0..47
    assert 0 < int(inside.sum()) < len(best)  # both cases occur
    assert torch.equal(out["top1"].bool(), law.argmax(-1) == best)
    expected = torch.where(inside, -law.gather(-1, best.unsqueeze(-1)).squeeze(-1), torch.zeros_like(law[:, 0]))
    torch.testing.assert_close(out["argmax_ce"].double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("args", "message"), [
    (["--rounds", "4", "--first-round", "4"], "--first-round=4 is invalid: must be below --rounds=4"),
    (["--init-from", "/no/such/draft"], "--init-from='/no/such/draft' is invalid: not an exported feature draft"),
    (["--lr", "0"], "--lr=0.0 is invalid: must be a number > 0"),
    (["--argmax-weight", "-1"], "--argmax-weight=-1.0 is invalid: must be a number >= 0"),
    (["--greedy-share", "1.5"], "--greedy-share=1.5 is invalid: must be a number in [0, 1]"),
    (["--greedy-windows", "fr:10"], "--greedy-windows='fr:10' is invalid: must be LANG:N[,N2...] with LANG one of"),
    (["--greedy-windows", "en:10,5"], "--greedy-windows='en:10,5' is invalid: must be LANG:N[,N2...] with LANG one"),
    (["--greedy-text", "en:x"], "--greedy-text='en:x' is invalid: must be LANG:N[,N2...] with LANG one of"),
    (["--greedy-text", "fr:5"], "--greedy-text='fr:5' is invalid: must be LANG:N[,N2...] with LANG one of"),
    (["--greedy-text", "en:10,5"], "--greedy-text='en:10,5' is invalid: must be LANG:N[,N2...] with LANG one of"),
    (["--sample-greedy", "--sample-part", "2/2"], "--sample-part='2/2' is invalid: must be I/N with integers"),
    (["--sample-part", "0/2"], "--sample-part='0/2' is invalid: must be I/N with integers 0 <= I < N, beside"),
])
def test_the_trainer_refuses_a_bad_fine_tune_in_one_line(cli, args, message):
    """Checked before the target loads or any teacher data is read: exit 2, the message names the value."""
    done = cli(*args, module="workloads.build.train_feature_draft")
    assert done.returncode == 2
    assert message in done.stderr.strip().splitlines()[-1]


def test_teacher_data_of_another_dtype_lives_in_its_own_work_folder():
    """Shards sampled in float32 are other data than bfloat16's: a run never mixes them (resuming reads shards)."""
    from workloads.build.train_feature_draft import Recipe, work_folder

    default, other = work_folder(Recipe()), work_folder(Recipe(teacher_dtype="float32"))
    assert default != other and default.parent == other.parent
    assert other.name == f"{default.name}-float32"


def test_window_prompts_are_new_training_runs_that_never_touch_a_held_out_line(templated):
    """Greedy data grows only with prompts: the overlapping runs are new, inside the band, seeded, and share no
    line with the held-out prompts every evaluation reads (the first 128 of the default shuffle)."""
    from workloads.build.teacher_data import bundled_workload, window_prompts, window_tranches
    from workloads.loader import load_workload, read_jsonl, resolve_path

    spec = bundled_workload("en")
    spec.update(num_prompts=None, chat_template=True)
    heldout = load_workload(spec, templated).prompts[:128]
    held_lines = {line for p in heldout for line in p.text.split("\n")}
    bundled = {text for _, text in read_jsonl(resolve_path(spec["path"]), spec["field"])}
    every = window_prompts(templated, "en", 128, lo=16, hi=64)
    assert len(every) > 2 * (len(bundled) - 128)  # many more than the training prompts they come from
    texts = [templated.decode(ids).split("user: ", 1)[1].rsplit("\n", 1)[0] for ids in every]
    assert len(set(texts)) == len(texts)
    for text in texts:
        assert text not in bundled
        assert not held_lines.intersection(text.split("\n")), text
        assert 16 <= len(templated(text)["input_ids"]) <= 64 + text.count("\n") * 2  # lines tokenised apart
    some = window_prompts(templated, "en", 128, limit=50, seed=3)
    assert len(some) == 50 and set(map(tuple, some)) <= set(map(tuple, every))
    assert some == window_prompts(templated, "en", 128, limit=50, seed=3)
    assert some != window_prompts(templated, "en", 128, limit=50, seed=4)
    # a larger set grows by disjoint tranches, the first being the smaller set: its shards stay valid
    first, rest, third = window_tranches(templated, "en", 128, [50, 120, 200], seed=3)
    assert first == some
    assert len(rest) == 70 and not set(map(tuple, rest)) & set(map(tuple, some))
    assert set(map(tuple, rest)) <= set(map(tuple, every))
    assert len(third) == 80 and not set(map(tuple, third)) & (set(map(tuple, some)) | set(map(tuple, rest)))
    assert len(window_tranches(templated, "en", 128, [50, len(every)], seed=3)[1]) == len(every) - 50


def test_corpus_prompts_are_documents_in_the_band_that_never_hold_a_held_out_line(templated, tmp_path):
    """Text outside the dialogues: a document of the build corpus is a prompt when it is lo..hi tokens long and
    holds no held-out prompt's line (12+ characters); duplicates once; a seeded choice; a missing corpus says how to
    build it."""
    from spectune.errors import SpectuneError
    from workloads.build.teacher_data import bundled_workload, corpus_prompts, corpus_tranches
    from workloads.loader import load_workload

    spec = bundled_workload("en")
    spec.update(num_prompts=None, chat_template=True)
    held_line = next(line for p in load_workload(spec, templated).prompts[:128] for line in p.text.split("\n")
                     if len(line) >= 12)
    fits = [f"document {i}: a fortune of a few words, long enough for the band" for i in range(6)]
    docs = [*fits, fits[0], "short", "a long one " * 40, f"it holds {held_line} inside"]
    assert 16 <= len(templated(docs[-1])["input_ids"]) <= 64  # refused for its line, not its length
    (tmp_path / "en.train.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    every = corpus_prompts(templated, "en", 128, corpus_dir=tmp_path)
    texts = [templated.decode(ids).split("user: ", 1)[1].rsplit("\n", 1)[0] for ids in every]
    assert texts == fits
    some = corpus_prompts(templated, "en", 128, limit=3, seed=1, corpus_dir=tmp_path)
    assert len(some) == 3 and some == corpus_prompts(templated, "en", 128, limit=3, seed=1, corpus_dir=tmp_path)
    assert set(map(tuple, some)) <= set(map(tuple, every))
    first, rest = corpus_tranches(templated, "en", 128, [3, 5], seed=1, corpus_dir=tmp_path)
    assert first == some and len(rest) == 2 and not set(map(tuple, rest)) & set(map(tuple, some))
    with pytest.raises(SpectuneError, match=r"run `python -m workloads\.build\.corpus` first"):
        corpus_prompts(templated, "it", 128, corpus_dir=tmp_path)
