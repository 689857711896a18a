import sys, time, statistics, torch
import harness.engine.proposer as prop
from env_speed import pair_and_engine, workload_cfg
from harness.engine.policy import DRAFT_SIGNALS, DraftLengthPolicy
from harness.measure import requests_of
from workloads.loader import load_workload
T = []
orig = prop.draft_signals
def timed(*a, **k):
    t0 = time.perf_counter(); out = orig(*a, **k); T.append((time.perf_counter() - t0, a[0].shape, None if len(a) < 5 else (a[4] is not None)))
    return out
prop.draft_signals = timed
class ReadAll(DraftLengthPolicy):
    name = "read-all"; signals = frozenset(DRAFT_SIGNALS)
    def __init__(self, gamma): self.gamma = gamma
    def begin_cycle(self, batch_size): return self.gamma
    def continue_drafting(self, step): return torch.ones_like(step.active)
torch.set_num_threads(2)
pair, engine = pair_and_engine("smollm2")
wl = load_workload(workload_cfg("en", 16), pair.tokenizer)
reqs = requests_of(wl.prompts[:16], 24)
conc = int(sys.argv[1]); engine.run(reqs[: max(4, 2 * conc)], ReadAll(2), conc)
print(len(T), T[0][1:], "median signal µs", 1e6 * statistics.median(t for t, *_ in T))
