"""What a run records: one row per request, one row per (cycle, request), and the run summary.

Field names follow vLLM's `bench serve` where it has them. Percentiles use numpy's default
``linear`` interpolation (stated in every summary as ``percentile_method``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from spectune.sampling import SamplingParams

PERCENTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "numpy.percentile, method='linear'"
DEFAULT_CATEGORY = "chat-lines"  # workloads.categories.CHAT_LINES: the bundled dialogue lines, the category of old runs


@dataclass
class Request:
    """One generation request.

    ``arrival_s`` is its send time in seconds after the run starts (open loop). ``None`` means a
    closed-loop client that sends the request when a slot frees, so its latency excludes queueing.
    ``category`` is what the prompt asks for (``workloads.categories``: chat-lines, chat, summarise, ...), carried
    into its record so that a run's tables can be broken down per category.
    ``sampling`` is the request's own temperature, top-k and top-p (None: the engine's, a workload's settings), and
    ``phase`` the workload phase it belongs to (None: a workload without phases); both go into its record.
    ``ignore_eos``: the answer runs to ``max_new_tokens`` whatever it emits (EOS does not end it).
    """

    request_id: int
    prompt_id: str
    language: str
    input_ids: list[int]
    max_new_tokens: int
    arrival_s: float | None = None
    category: str = DEFAULT_CATEGORY
    sampling: SamplingParams | None = None
    phase: str | None = None
    ignore_eos: bool = False


@dataclass
class RequestRecord:
    request_id: int
    prompt_id: str
    language: str
    prompt_tokens: int
    arrival_s: float | None
    category: str = DEFAULT_CATEGORY
    temperature: float | None = None  # the settings the request was sampled with (its own, or the engine's)
    top_k: int | None = None
    top_p: float | None = None
    phase: str | None = None
    admitted_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    output_ids: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)  # emission time of every output token
    status: str = "ok"
    error: str | None = None

    @classmethod
    def of(cls, request: Request, sampling: SamplingParams) -> RequestRecord:
        """A request's record before it runs: who it is, and the settings it samples with (its own or the engine's)."""
        return cls(request.request_id, request.prompt_id, request.language, len(request.input_ids), request.arrival_s,
                   request.category, temperature=float(sampling.temperature), top_k=int(sampling.top_k),
                   top_p=float(sampling.top_p), phase=request.phase)

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        n = self.output_tokens
        done = self.status == "ok" and self.finish_s is not None and self.first_token_s is not None
        ttft = (self.first_token_s - self.arrival_s) if done else None
        e2el = (self.finish_s - self.arrival_s) if done else None
        # Chunks: a speculative cycle delivers several tokens at one instant; ITL is the gap between chunks.
        chunk_times = sorted(set(self.token_times_s))
        out.update(
            output_tokens=n,
            ttft_ms=ttft * 1e3 if ttft is not None else None,
            e2el_ms=e2el * 1e3 if e2el is not None else None,
            tpot_ms=(e2el - ttft) / (n - 1) * 1e3 if done and n > 1 else None,
            itls_ms=list(np.diff(chunk_times) * 1e3),
            tokens_per_s=n / e2el if done and e2el else None,
        )
        return out


@dataclass
class CycleRecord:
    """One draft-and-verify cycle as seen by one request (γ = 0: an autoregressive step)."""

    cycle: int
    request_id: int
    slot: int
    batch_size: int
    gamma: int  # ceiling the policy chose
    num_drafts: int  # drafts this request really used
    accepted: int
    emitted: int
    draft_s: float
    verify_s: float
    rest_s: float
    start_s: float
    # Host time in the policy's calls this cycle (begin_cycle, continue_drafting, end_drafting, observe); the part
    # outside the timed draft/verify/rest spans (begin_cycle, observe) is policy_outside_s. 0 for fixed γ.
    policy_s: float = 0.0
    policy_outside_s: float = 0.0


def _stats(values: list[float] | np.ndarray, name: str) -> dict[str, float | None]:
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return {f"mean_{name}": None, f"median_{name}": None, f"std_{name}": None,
                **{f"p{p}_{name}": None for p in PERCENTILES}}
    out = {f"mean_{name}": float(arr.mean()), f"median_{name}": float(np.median(arr)),
           f"std_{name}": float(arr.std())}
    out.update({f"p{p}_{name}": float(np.percentile(arr, p, method="linear")) for p in PERCENTILES})
    return out


def requests_frame(records: list[RequestRecord]) -> pd.DataFrame:
    return pd.DataFrame([r.row() for r in records])


def cycles_frame(records: list[CycleRecord]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in records])


def asked_cycles(cycles: pd.DataFrame) -> pd.DataFrame:
    """The request-cycles in which the policy asked for drafts (γ > 0), whether or not the proposer found any."""
    if not len(cycles) or "num_drafts" not in cycles:
        return cycles.iloc[0:0]
    return cycles[cycles["gamma"] > 0] if "gamma" in cycles else cycles[cycles["num_drafts"] > 0]


def per_request_acceptance(cycles: pd.DataFrame, keys: tuple[str, ...] = ("request_id",)) -> pd.DataFrame:
    """Per request (``keys``), what speculation did: request-cycles with drafts (``spec_cycles``) and without a
    proposal although γ > 0 (``no_proposal_cycles``: a lookup that found no match), drafted and accepted tokens, the
    acceptance rate and length. A run's mean hides what matters for model-free drafts: a copy span accepts every
    token and free text none, request by request."""
    asked = asked_cycles(cycles)
    columns = ["spec_cycles", "no_proposal_cycles", "drafted_tokens", "accepted_tokens", "acceptance_rate",
               "acceptance_length", "no_proposal_share"]
    if not len(asked):
        return pd.DataFrame(columns=[*keys, *columns])
    drafted = asked["num_drafts"] > 0
    frame = asked.assign(spec=drafted.astype(int), none=(~drafted).astype(int),
                         acc=asked["accepted"].where(drafted, 0))
    out = frame.groupby(list(keys), sort=False).agg(spec_cycles=("spec", "sum"), no_proposal_cycles=("none", "sum"),
                                                    drafted_tokens=("num_drafts", "sum"),
                                                    accepted_tokens=("acc", "sum")).reset_index()
    spec, drafted_tokens = out["spec_cycles"], out["drafted_tokens"]
    out["acceptance_rate"] = (out["accepted_tokens"] / drafted_tokens).where(drafted_tokens > 0)
    out["acceptance_length"] = (1 + out["accepted_tokens"] / spec).where(spec > 0)
    out["no_proposal_share"] = out["no_proposal_cycles"] / (spec + out["no_proposal_cycles"])
    return out


def with_acceptance(requests: pd.DataFrame, cycles: pd.DataFrame) -> pd.DataFrame:
    """``requests`` (one run's rows, unique ``request_id``) with :func:`per_request_acceptance`'s columns; a request
    without speculative cycles (autoregressive) has 0 cycles and no acceptance."""
    if not len(requests):
        return requests
    acceptance = per_request_acceptance(cycles)
    out = requests.merge(acceptance, on="request_id", how="left")
    for key in ("spec_cycles", "no_proposal_cycles", "drafted_tokens", "accepted_tokens"):
        out[key] = out[key].fillna(0).astype(int)
    for key in ("acceptance_rate", "acceptance_length", "no_proposal_share"):
        out[key] = out[key].astype(float)
    return out


def summarise(requests: pd.DataFrame, cycles: pd.DataFrame, counters: dict[str, float] | None = None) -> dict[str, Any]:
    """Run-level metrics. Throughput spans first dispatch → last completion; failed requests excluded. Acceptance
    comes from the cycles where the engine records them (spectune's), else from the engine's per-request counters
    (a server's ``drafted_tokens`` / ``accepted_tokens``) and its engine-wide ``counters`` (verification steps)."""
    ok = requests[requests["status"] == "ok"] if len(requests) else requests
    out: dict[str, Any] = {"completed": len(ok), "failed": int(len(requests) - len(ok)),
                           "percentile_method": PERCENTILE_METHOD}
    if len(ok):
        start = float(requests["arrival_s"].min())
        duration = float(ok["finish_s"].max()) - start
        total_out = int(ok["output_tokens"].sum())
        out.update(
            duration_s=duration,
            total_output_tokens=total_out,
            total_input_tokens=int(ok["prompt_tokens"].sum()),
            request_throughput=len(ok) / duration if duration > 0 else None,
            output_throughput=total_out / duration if duration > 0 else None,
        )
        out.update(_stats(ok["ttft_ms"].tolist(), "ttft_ms"))
        out.update(_stats(ok["tpot_ms"].tolist(), "tpot_ms"))
        out.update(_stats([x for itl in ok["itls_ms"] for x in itl], "itl_ms"))
        out.update(_stats(ok["e2el_ms"].tolist(), "e2el_ms"))
    if not len(cycles) and "drafted_tokens" in requests:
        out.update(counted_acceptance(ok, counters))
    else:
        out.update(acceptance_summary(cycles))
    return out


def counted_acceptance(requests: pd.DataFrame, counters: dict[str, float] | None) -> dict[str, Any]:
    """Acceptance as a server counts it: drafted and accepted tokens summed over the requests that report them,
    and, from the engine-wide counters of the same requests, the verification steps (``spec_decode_num_drafts``)
    and the acceptance length they give (1 + accepted / steps). What is not counted is absent."""
    reported = requests[requests["drafted_tokens"].notna()] if len(requests) else requests
    out: dict[str, Any] = {"acceptance_source": "engine counters"}
    if len(reported):
        drafted = int(reported["drafted_tokens"].sum())
        accepted = int(reported["accepted_tokens"].fillna(0).sum()) if "accepted_tokens" in reported else None
        out.update(spec_decode_draft_tokens=drafted, spec_decode_accepted_tokens=accepted,
                   spec_decode_acceptance_rate=accepted / drafted if drafted and accepted is not None else None)
    steps = (counters or {}).get("spec_decode_num_drafts")
    if steps is not None:
        out["spec_decode_num_drafts"] = int(steps)
        counted = (counters or {}).get("spec_decode_accepted_tokens")
        if steps and counted is not None:
            out["spec_decode_acceptance_length"] = 1 + counted / steps
    return out


def add_counters(parts: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Engine-wide counters of several blocks or repeats, summed (None when none has any)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    return {key: float(sum(p.get(key, 0.0) for p in present)) for key in sorted({k for p in present for k in p})}


def acceptance_summary(cycles: pd.DataFrame) -> dict[str, Any]:
    """vLLM's speculative metrics plus the accepted-length histogram (gpt-fast's ``accept_counts``); the share of
    request-cycles that asked for drafts and got none (a model-free proposer without a match), milliseconds per
    cycle by part (draft, verify, the rest) and what a cycle in which no row had a proposal costs; the acceptance
    length per request (percentiles over requests, a repeat's request being its own)."""
    spec = cycles[cycles["num_drafts"] > 0] if len(cycles) else cycles
    if not len(spec):
        return {"spec_decode_num_drafts": 0}
    asked = asked_cycles(cycles)
    missed = asked[asked["num_drafts"] == 0]
    keys = ("repeat", "request_id") if "repeat" in cycles else ("request_id",)
    per_request = per_request_acceptance(cycles, keys)["acceptance_length"].dropna().to_numpy(float)
    # what a miss costs: the cycles in which no row had a proposal (a batched cycle's time is shared by its rows)
    idle = asked.groupby("cycle")["num_drafts"].transform("max") == 0
    missed_cycles = asked[idle].drop_duplicates("cycle")
    drafted, accepted = int(spec["num_drafts"].sum()), int(spec["accepted"].sum())
    max_len = int(spec["num_drafts"].max())
    per_position = [float((spec["accepted"] > i).sum() / len(spec)) for i in range(max_len)]
    # as int: concatenating interleaved blocks, some without cycles, can make the column float
    hist = np.bincount(spec["accepted"].to_numpy().astype(int), minlength=max_len + 1)
    return {
        "spec_decode_num_drafts": len(spec),
        "spec_decode_draft_tokens": drafted,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": accepted / drafted if drafted else None,
        "spec_decode_acceptance_length": 1 + accepted / len(spec),
        "spec_decode_per_position_acceptance_rates": per_position,
        "accepted_length_histogram": hist.tolist(),
        "mean_draft_ms_per_cycle": float(spec.drop_duplicates("cycle")["draft_s"].mean() * 1e3),
        "mean_verify_ms_per_cycle": float(spec.drop_duplicates("cycle")["verify_s"].mean() * 1e3),
        "mean_rest_ms_per_cycle": float(spec.drop_duplicates("cycle")["rest_s"].mean() * 1e3),
        "spec_decode_no_proposal_share": len(missed) / len(asked) if len(asked) else None,
        "mean_no_proposal_ms_per_cycle": (float((missed_cycles["draft_s"] + missed_cycles["verify_s"]
                                                 + missed_cycles["rest_s"]).mean() * 1e3)
                                          if len(missed_cycles) else None),
        **{f"p{p}_request_acceptance_length": float(np.percentile(per_request, p, method="linear"))
           for p in (10, 50, 90) if per_request.size},
    }


def summarise_repeats(points: list[dict[str, Any]], requests: pd.DataFrame, cycles: pd.DataFrame) -> dict[str, Any]:
    """One method measured in several repeats (each its own run with its own clock).

    Throughputs are the median over the repeats' own values (a throughput over a span that mixes two
    runs' clocks would be meaningless); latency percentiles and the acceptance metrics pool every request
    and cycle of every repeat; peak memory is the highest of the repeats. ``points`` are the per-repeat
    summaries (``status`` ok only count); ``requests`` / ``cycles`` carry a ``repeat`` column.
    """
    ok = [p for p in points if p.get("status") == "ok"]
    if "repeat" in cycles and len(cycles):  # cycle numbers restart every run: make them unique per repeat
        cycles = cycles.assign(cycle=cycles["repeat"].astype(int) * (int(cycles["cycle"].max()) + 1)
                               + cycles["cycle"])
    counters = add_counters([p.get("engine_counters") for p in ok])
    out = summarise(requests, cycles, counters)
    if counters is not None:
        out["engine_counters"] = counters
    for key in ("output_throughput", "request_throughput"):
        values = [p[key] for p in ok if p.get(key) is not None]
        out[key] = float(np.median(values)) if values else None
        out[f"{key}_per_repeat"] = values
    out["duration_s"] = float(sum(p.get("duration_s") or 0.0 for p in ok))
    out["repeats"] = len(ok)
    for key in {k for p in ok for k in p if k.startswith("peak_")}:
        values = [p[key] for p in ok if isinstance(p.get(key), int | float)]
        if values:
            out[key] = max(values)
    return out
