"""Draft step with every draft signal read (a policy that never stops), smollm2, at 1 and 8 rows: mean ms a step."""
import sys, statistics, itertools
import torch
from env_speed import pair_and_engine, workload_cfg  # bench/ on sys.path via the caller's PYTHONPATH
from harness.engine.policy import DRAFT_SIGNALS, DraftLengthPolicy
from harness.measure import requests_of
from harness.engine.records import cycles_frame
from workloads.loader import load_workload
import harness
print("harness from", harness.__file__)

class ReadAll(DraftLengthPolicy):
    name = "read-all"
    signals = frozenset(DRAFT_SIGNALS)
    def __init__(self, gamma): self.gamma = gamma
    def begin_cycle(self, batch_size): return self.gamma
    def continue_drafting(self, step): return torch.ones_like(step.active)

torch.set_num_threads(2)
pair, engine = pair_and_engine("smollm2")
wl = load_workload(workload_cfg("en", 16), pair.tokenizer)
for conc in (1, 8):
    reqs = requests_of(wl.prompts[: 2 * conc if conc > 1 else 4], 24)
    engine.run(reqs[:conc], ReadAll(2), conc)  # warm-up
    res = engine.run(reqs, ReadAll(2), conc)
    cyc = cycles_frame(res.cycles).groupby("cycle").first()
    spec = cyc[cyc["num_drafts"] > 0]
    per_step = (spec["draft_s"] / spec["gamma"]).to_numpy()
    print(f"rows {conc}: {len(spec)} cycles, draft step mean {1e3*per_step.mean():.2f} ms, median {1e3*statistics.median(per_step):.2f} ms; verify mean {1e3*spec['verify_s'].mean():.1f} ms")
