"""The draft distillation's pieces that decide what is learned: the bucketed losses and the vocabulary choice —
known answers on hand-built laws (the training run itself needs the real target and CPU hours)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import torch

from spectune.models.draft_vocab import target_to_draft_map
from workloads.build.distil import bucket_losses, choose_vocab
from workloads.build.teacher_data import Sequence

# A 6-id target vocabulary; the draft keeps ids 1, 3, 4 (rows 0, 1, 2).
D2T = torch.tensor([1, 3, 4])
T2D = target_to_draft_map(D2T, 6)
ROWS = 3


def _logits(q: list[float]) -> torch.Tensor:
    """Draft logits over its rows giving law ``q`` (Σ q ≤ 1; no mass leaves the rows through the logits)."""
    return torch.tensor([q]).log()


def test_a_draft_equal_to_the_teacher_inside_its_vocabulary_has_no_loss_and_alpha_bound_one():
    ids = torch.tensor([[3, 1, 4]], dtype=torch.int32)  # top-3 of the teacher, all inside the draft vocabulary
    probs = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float16)
    out = bucket_losses(_logits([0.3, 0.5, 0.2]), ids, probs, T2D, ROWS)  # rows: ids 1, 3, 4
    assert math.isclose(float(out["kl"]), 0.0, abs_tol=1e-3)
    assert math.isclose(float(out["tv"]), 0.0, abs_tol=1e-3)
    assert math.isclose(float(out["alpha_lb"]), 1.0, abs_tol=1e-3)


def test_teacher_mass_outside_the_draft_vocabulary_is_the_other_bucket():
    """Teacher: id 3 at 0.6, id 0 (outside the draft) at 0.3, and 0.1 outside its top-2: the other bucket holds
    0.4. Draft: id 3 at 1.0, so its other bucket is empty. TV = ½(|0.6 − 1| + |0.4 − 0|) = 0.4; the α bound counts
    only top-k ids inside the vocabulary: min(0.6, 1.0) = 0.6; KL = 0.6 ln 0.6 + 0.4 ln(0.4 / 1e-6)."""
    ids = torch.tensor([[3, 0]], dtype=torch.int32)
    probs = torch.tensor([[0.6, 0.3]], dtype=torch.float16)
    logits = torch.tensor([[-1e4, 0.0, -1e4]])  # all of q on row 1 (id 3)
    out = bucket_losses(logits, ids, probs, T2D, ROWS)
    p = float(torch.tensor(0.6, dtype=torch.float16))
    assert math.isclose(float(out["tv"]), 1 - p, abs_tol=1e-4)
    assert math.isclose(float(out["alpha_lb"]), p, abs_tol=1e-4)
    expected_kl = p * math.log(p) + (1 - p) * math.log((1 - p) / 1e-6)
    assert math.isclose(float(out["kl"]), expected_kl, rel_tol=1e-3)


def test_the_losses_pull_the_draft_towards_the_teacher():
    ids = torch.tensor([[4, 1]], dtype=torch.int32)
    probs = torch.tensor([[0.7, 0.2]], dtype=torch.float16)
    logits = torch.zeros(1, ROWS, requires_grad=True)
    out = bucket_losses(logits, ids, probs, T2D, ROWS)
    (out["kl"] + out["tv"]).sum().backward()
    assert logits.grad[0, 2] < 0 < logits.grad[0, 1]  # raise id 4 (row 2, p 0.7), lower id 3 (row 1, p 0)


def test_the_vocabulary_is_the_ids_with_most_teacher_mass_plus_the_specials_sorted():
    def seq(ids: list[int], probs: list[float]) -> Sequence:
        return Sequence("en", [0], [ids[0]], torch.tensor([ids], dtype=torch.int32),
                        torch.tensor([probs], dtype=torch.float16))

    seqs = [seq([5, 2], [0.6, 0.3]), seq([2, 4], [0.5, 0.4]), seq([4, 1], [0.5, 0.1])]
    # mass: id 2 0.8, id 4 0.9, id 5 0.6, id 1 0.1; special id 0 always in
    assert choose_vocab(seqs, 3, specials=[0], vocab_size=6).tolist() == [0, 2, 4]
    assert choose_vocab(seqs, 4, specials=[0], vocab_size=6).tolist() == [0, 2, 4, 5]


def test_select_draft_refuses_a_folder_that_is_not_a_draft_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "workloads.build.select_draft", str(tmp_path)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: draft folder {str(tmp_path)!r} holds no draft_vocab.safetensors: give folders that python -m "
        "workloads.build.train_draft --out wrote"]
