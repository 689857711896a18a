"""`python -m harness task=evaluate +workload=it` (alias: ``python -m policies.evaluate``): every draft-length policy
against the best fixed γ, live, on held-out prompts — adaptation separated from simply choosing a better γ.

Per language (the workload) and per concurrency in ``evaluate.concurrency``, into the Hydra run directory:

1. Split the workload's seeded shuffle: the first ``train.train_prompts`` train, the next
   ``train.heldout_prompts`` are held out (the split ``policies.train`` uses). An empty split is an error.
2. Grid search on the training prompts over **every** γ in 0..``train.max_gamma`` (γ = 0 is autoregressive
   decoding), or over AR and ``evaluate.grid``'s values where it is given: the best by decode throughput (the
   comparison's primary metric) is the baseline (``grid.parquet``, ``grid_c<N>.csv``).
3. Learned policies: from ``evaluate.policies_from`` (a ``policies.train`` run directory, or an earlier
   evaluate's ``train/``), refused if it was trained on any held-out prompt; else trained here per concurrency
   (``train/c<N>/``: traces of the training prompts, the measured cost profile — with ``evaluate.calibrate``
   scaled so that replay matches the grid's live throughput (``policies.train.calibrate``) — the PPO γ policy
   (and size policy at concurrency > 1), the cycle policy when ``train.cycle_timesteps`` > 0 (``ppo-cycle``, not in
   the default list: the comparison piece for ``ppo``), and the acceptance classifier fitted on the same traces).
   With ``evaluate.tune`` (default) the threshold baselines get the same budget: each threshold is chosen in
   replay on those training traces with that profile (``policies.train.tuning``; every value tried in ``tuning.csv``).
4. Held-out, live: AR, the best fixed γ and every policy of ``evaluate.policies`` (ceiling ``train.max_gamma``),
   ``evaluate.repeats`` paired repeats in rotated order, the same keyed random streams for every method. With
   ``evaluate.hindsight`` every other fixed γ in 1..max_gamma runs too: the hindsight-fixed ceiling. With
   ``evaluate.noise_floor`` AR runs twice (the "ar (A/A)" row against AR is the measured noise floor). With
   ``evaluate.block_prompts`` (grid and held-out runs) every method runs on a block of prompts before the next
   block starts (:mod:`spectune.measure.interleave`), so that a drifting machine's drift falls on every method alike.
5. The oracle: the held-out prompts traced at ``train.max_gamma``, replayed with the (calibrated) profile: the
   hindsight bound and each policy's replay score on the same cycles (``policies.envs.replay``). ``replay_*`` and
   ``oracle_*`` columns compare with the best fixed γ *in hindsight on those traces*, not the grid's γ.
6. ``comparison.parquet`` (columns: ``analysis.policy_table.COLUMNS``), ``comparison.md`` (the printed table),
   held-out ``requests.parquet``/``cycles.parquet``, ``metadata.json``. Results are rewritten after every step.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, open_dict

from analysis.policy_table import AA_POLICY, BEST_FIXED, comparison_frame, comparison_rows, format_comparison
from policies.evaluate.schema import EvaluateConfig
from policies.registry import POLICIES, make_policy, policy_config
from policies.train.schema import TrainConfig
from policies.train.tuning import tunable
from spectune.config import typed
from spectune.engines.spectune import SpectuneEngine
from spectune.errors import SpectuneError
from spectune.measure.interleave import as_method, block_for, block_size, design_option, run_design
from spectune.measure.repeats import Grid, aggregate, repeats_option
from spectune.methods import AA_LABEL, BASELINE, FIXED, Method
from spectune.options import as_list, integer
from spectune.run import conditions, rundir
from spectune.run.metadata import finished_metadata
from spectune.stats.by_category import by_category, durations_of, several_categories
from spectune.stats.compare import decode_rates
from spectune.stats.units import unit_size_of

log = logging.getLogger("policies.evaluate")
LEARNED = ("ppo", "ppo-distilled", "ppo-cycle", "acceptance-classifier")  # their files come from the training stage


@dataclass(frozen=True)
class EvaluateSettings:
    policies: tuple[str, ...]
    concurrency: tuple[int, ...]
    repeats: int
    grid_repeats: int
    warmup: int
    policies_from: str | None
    max_gamma: int
    train_prompts: int
    heldout_prompts: int
    params: dict[str, dict[str, Any]]
    calibrate: bool = False
    tune: bool = True
    hindsight: bool = False
    block_prompts: int | None = None  # the interleaved block size given (None: one batch per block)
    noise_floor: bool = False  # AR twice on the held-out prompts: the A/A row
    design: str = "interleaved"  # "blocked": every method runs all prompts at once (spectune.measure.interleave)
    grid: tuple[int, ...] | None = None  # the γ values the grid search times besides AR (None: every γ in 1..max_gamma)

    @property
    def grid_gammas(self) -> list[int]:
        """The γ values the grid search times on the training prompts, AR (0) first."""
        return [0, *(self.grid if self.grid is not None else range(1, self.max_gamma + 1))]

    def block_for(self, concurrency: int) -> int | None:
        """The block size of the runs at ``concurrency`` (None: the blocked design)."""
        return block_for(self.design, self.block_prompts, concurrency)

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> EvaluateSettings:
        """The ``evaluate`` node and the ``train`` keys it shares, before any model loads: their types from the
        schemas (policies/evaluate/schema.py, policies/train/schema.py), then the ranges, choices and the rules
        across keys here; each error one line (SpectuneError) naming the key."""
        e = typed(EvaluateConfig, cfg.evaluate, "evaluate")
        train = typed(TrainConfig, cfg.train, "train")
        names = list(e.policies) if isinstance(e.policies, list) else [e.policies]
        for name in names:
            if name not in POLICIES or name == FIXED:
                allowed = ", ".join(sorted(n for n in POLICIES if n != FIXED))
                raise SpectuneError(f"evaluate.policies contains {name!r}: choose from {allowed} (AR and the best "
                                    "fixed γ always run)")
        conc = list(e.concurrency) if isinstance(e.concurrency, list) else [e.concurrency]
        conc = [integer(c, "evaluate.concurrency", lo=1) for c in conc]
        if not conc or len(set(conc)) != len(conc):
            raise SpectuneError(f"evaluate.concurrency={conc} is invalid: one or more distinct integers >= 1")
        params = e.params or {}
        if not isinstance(params, dict) or not all(isinstance(v, dict | None) for v in params.values()):
            raise SpectuneError(f"evaluate.params={params!r} is invalid: must be null or a mapping of policies to "
                                "their parameters, e.g. evaluate.params={confidence:{threshold:0.3}}")
        for name in params:
            if name not in names:
                raise SpectuneError(f"evaluate.params.{name} is invalid: {name!r} is not in evaluate.policies "
                                    f"({', '.join(names)})")
        block = block_size(e.block_prompts, "evaluate.block_prompts", conc, f"evaluate.concurrency={conc}")
        settings = cls(tuple(names), tuple(conc), repeats_option(e.repeats),
                       integer(e.grid_repeats, "evaluate.grid_repeats", lo=1), integer(e.warmup, "evaluate.warmup",
                                                                                     lo=0),
                       e.policies_from, integer(train.max_gamma, "train.max_gamma", lo=1),
                       integer(train.train_prompts, "train.train_prompts", lo=1),
                       integer(train.heldout_prompts, "train.heldout_prompts", lo=0), params, e.calibrate, e.tune,
                       e.hindsight, block, e.noise_floor, design_option(e.design, "evaluate.design", block, None),
                       grid_option(e.grid, train.max_gamma))
        if settings.heldout_prompts == 0:
            raise SpectuneError("train.heldout_prompts=0 is invalid: the comparison needs held-out prompts (>= 1)")
        if settings.policies_from and not Path(settings.policies_from).is_dir():
            raise SpectuneError(f"evaluate.policies_from={settings.policies_from!r} is not found: give the run "
                                "directory of python -m policies.train (with gamma.zip)")
        if "ppo-cycle" in names and not settings.policies_from and not train.cycle_timesteps:
            raise SpectuneError("evaluate.policies contains 'ppo-cycle': set train.cycle_timesteps > 0 so that the "
                                "training stage writes its cycle.zip (or give evaluate.policies_from with one)")
        for name in names:  # parameters checked before any model loads (learned policies' files come later)
            if name not in LEARNED:
                make_policy(policy_node(name, params.get(name)), settings.max_gamma)
        if not settings.policies_from and (set(LEARNED) & set(names) or (settings.tune and tunable(names))):
            from policies.train.pipeline import TrainSettings  # the training stage's keys, before the grid runs

            TrainSettings.from_cfg(cfg)
        return settings


def grid_option(value: Any, max_gamma: int) -> tuple[int, ...] | None:
    """``evaluate.grid``: distinct γ values in 1..max_gamma, sorted (None: every one). A coarse grid keeps a long
    ceiling affordable (suffix decoding drafts up to 24 tokens: 25 timed γ values otherwise)."""
    if value is None:
        return None
    gammas = [integer(g, "evaluate.grid", lo=1, hi=max_gamma) for g in as_list(value, "evaluate.grid")]
    if not gammas or len(set(gammas)) != len(gammas):
        raise SpectuneError(f"evaluate.grid={value!r} is invalid: null (every γ in 1..train.max_gamma) or distinct "
                            f"integers in 1..{max_gamma} (AR always runs)")
    return tuple(sorted(gammas))


def policy_node(name: str, params: dict[str, Any] | None = None, **files: Any) -> dict[str, Any]:
    """A policy's config: conf/policy/<name>.yaml, then ``evaluate.params.<name>``, then the files given."""
    return {**policy_config(name), **(params or {}), **files}


# -- learned policies -------------------------------------------------------------------------------------
def _trained(cfg: DictConfig, settings: EvaluateSettings, run_dir: Path, concurrency: int,
             heldout_ids: set[str], grid_csv: Path | None) -> Path:
    """The directory with gamma.zip, traces and profile for ``concurrency``: given or trained here."""
    if settings.policies_from:
        base = Path(settings.policies_from)
        found = base / f"c{concurrency}" if rundir.GAMMA_POLICY.exists(base / f"c{concurrency}") else base
        if not rundir.GAMMA_POLICY.exists(found):
            raise SpectuneError(f"evaluate.policies_from={str(base)!r} is invalid: no gamma.zip there (nor in "
                                f"c{concurrency}/)")
        trained = _train_ids(found)
        overlap = sorted(trained & heldout_ids)
        if overlap:
            raise SpectuneError(f"evaluate.policies_from={str(base)!r} is invalid: it was trained on {len(overlap)} "
                                f"held-out prompt(s) (e.g. {overlap[0]!r}); use the same split (train.* sizes, seed)")
        return found
    from policies.train.pipeline import train_policies

    out = run_dir / "train" / f"c{concurrency}"
    out.mkdir(parents=True, exist_ok=True)
    sub = cfg.copy()
    with open_dict(sub):
        sub.train.concurrency = concurrency
        if grid_csv is not None:  # the replay's costs made to agree with the live grid on these prompts
            sub.train.calibrate_to = str(grid_csv)
    log.info("training the learned policies for concurrency %d into %s", concurrency, out)
    train_policies(sub, out)
    return out


def _train_ids(directory: Path) -> set[str]:
    if not rundir.TRACES_METADATA.exists(directory):
        return set()
    split = rundir.TRACES_METADATA.read(directory).get("split", {})
    return set(split.get("train", []))


def _training_traces(directory: Path) -> Any:
    """The training traces the learned policies of ``directory`` were trained on (recorded there, or given)."""
    from policies.envs.data import TraceSet, read_traces

    path = rundir.TRACES.path(directory)
    if not path.is_file():
        path = Path(str(rundir.TRAIN.read(directory).get("settings", {}).get("traces") or path))
    if not path.is_file():
        raise SpectuneError(f"evaluate.tune=true needs the training traces of {str(directory)!r}: none found "
                            "(set evaluate.tune=false or train here)")
    return TraceSet(*read_traces(path), "training traces")


def _tuned(methods: list[tuple[str, int, dict]], settings: EvaluateSettings, learned: Path, concurrency: int
           ) -> tuple[list[tuple[str, int, dict]], pd.DataFrame]:
    """The threshold baselines with their values tuned in replay on the training traces (explicit
    ``evaluate.params`` values are kept as given)."""
    from policies.train.tuning import GRIDS, tune

    candidates = {label: node for label, _, node in methods
                  if label in GRIDS and GRIDS[label][0] not in settings.params.get(label, {})}
    if not candidates:
        return methods, pd.DataFrame()
    log.info("tuning %s on the training traces (replay, the learned policies' profile)", ", ".join(candidates))
    tuned, table = tune(candidates, _training_traces(learned), learned_profile(learned), settings.max_gamma)
    return [(label, gamma, tuned.get(label, node)) for label, gamma, node in methods], \
        table.assign(concurrency=concurrency)


def _classifier(directory: Path, seed: int) -> Path:
    out = rundir.CLASSIFIER.path(directory)
    if not out.is_file():
        from policies.train.fit_classifier import fit_file

        fit_file(rundir.TRACES.path(directory), out, hidden=[], target="accept_prob", epochs=300, seed=seed)
    return out


def learned_files(name: str, learned: Path | None, concurrency: int) -> dict[str, str]:
    """The policy files ``name`` reads from the learned policies' directory (none for the other policies)."""
    if name == "ppo":
        files = {"gamma_path": str(rundir.GAMMA_POLICY.found(learned))}
        if concurrency > 1 and rundir.SIZE_POLICY.exists(learned):  # LTD's size policy, batches only
            files["size_path"] = str(rundir.SIZE_POLICY.path(learned))
        return files
    if name == "ppo-distilled":  # the thresholds travel inside gamma.zip
        return {"gamma_path": str(rundir.GAMMA_POLICY.found(learned))}
    if name == "ppo-cycle":
        if not rundir.CYCLE_POLICY.exists(learned):
            raise SpectuneError(f"evaluate.policies contains 'ppo-cycle' but {learned} holds no cycle.zip: "
                                "train it with train.cycle_timesteps > 0")
        return {"path": str(rundir.CYCLE_POLICY.path(learned))}
    return {}


def learned_profile(directory: Path) -> Any:
    """The cost profile the learned policies of ``directory`` were trained with (calibrated when it was)."""
    from spectune.costmodel.profile import load_profile

    for file in (rundir.PROFILE_CALIBRATED, rundir.PROFILE):
        if file.exists(directory):
            return load_profile(file.path(directory))
    settings = rundir.TRAIN.read(directory).get("settings", {})
    return load_profile(settings.get("profile"))


# -- the steps --------------------------------------------------------------------------------------------
def _measure(engine: Any, requests: list, methods: list[tuple[str, int, dict]], concurrency: int, repeats: int,
             warmup: int, max_context: int | None, block_prompts: int | None = None) -> Grid:
    """Every (label, γ, policy node) once per repeat in rotated order (γ = 0: autoregressive); with
    ``block_prompts``, the methods interleaved block by block (:mod:`spectune.measure.interleave`), each policy
    built once per repeat and carried across its blocks, warm-up before its first block only."""
    nodes = {label: node for label, _, node in methods}
    order = [(label, gamma) for label, gamma, _ in methods]
    if block_prompts is not None:
        blocks = -(-len(requests) // block_prompts)
        log.info("interleaving %d methods over %d blocks of <= %d prompts", len(order), blocks, block_prompts)
    measured = SpectuneEngine(engine, lambda m: make_policy(nodes[m.label], m.gamma), max_context)
    return run_design(measured, requests, [as_method(label, gamma, nodes[label]) for label, gamma in order], repeats,
                      block_prompts=block_prompts, concurrency=concurrency, warmup=warmup)


def _grid_search(engine: Any, train: list, settings: EvaluateSettings, concurrency: int, max_context: int | None,
                 seed: int) -> tuple[int, pd.DataFrame]:
    """Every γ of the grid (``evaluate.grid``; AR included) on the training prompts: the best by pooled decode
    throughput (ties: smaller γ)."""
    gammas = settings.grid_gammas
    methods = [(Method.fixed(g).label, g, {"name": FIXED}) for g in gammas]
    log.info("grid search on %d training prompts, concurrency %d: γ = %s, %d repeat(s)", len(train), concurrency,
             f"0..{settings.max_gamma}" if settings.grid is None else ", ".join(map(str, gammas)),
             settings.grid_repeats)
    block = settings.block_for(concurrency)
    grid = _measure(engine, train, methods, concurrency, settings.grid_repeats, settings.warmup, max_context, block)
    summaries, _ = aggregate(grid, seed=seed, unit_size=unit_size_of(concurrency, block))
    decode = decode_rates(grid.frames()[0])
    frame = pd.DataFrame([{"concurrency": concurrency, "method": s["method"], "gamma": int(s["gamma"]),
                           "status": s["status"], "decode_tok_s": decode.get(s["method"]),
                           "tok_s": s.get("output_throughput_pooled"),
                           "tok_s_ci95_lo": s.get("output_throughput_ci95_lo"),
                           "tok_s_ci95_hi": s.get("output_throughput_ci95_hi"),
                           "acceptance_length": s.get("spec_decode_acceptance_length")} for s in summaries])
    ok = frame[(frame["status"] == "ok") & frame["decode_tok_s"].notna()]
    if not len(ok):
        raise SpectuneError(f"the grid search failed at every γ (concurrency {concurrency}): see the log")
    best = ok.sort_values(["decode_tok_s", "gamma"], ascending=[False, True]).iloc[0]
    log.info("best fixed γ on the training prompts at concurrency %d: %d (%.1f decode tok/s, %.1f end to end)",
             concurrency, best["gamma"], best["decode_tok_s"], best["tok_s"])
    return int(best["gamma"]), frame


def _replay(engine: Any, heldout: list, concurrency: int, max_gamma: int, profile: Any, policies: dict[str, Any],
            run_dir: Path) -> dict[str, dict[str, float]]:
    """Trace the held-out prompts and replay every policy and the oracle on them with ``profile``."""
    from policies.envs.data import TraceSet
    from policies.envs.replay import ORACLE_KEYS, replay_gammas, replay_scores
    from spectune.engine.traces import record

    frame = record(engine.session(heldout, None, concurrency, keep_laws=True), heldout, max_gamma)
    rundir.HELDOUT_TRACES.named(concurrency=concurrency).write(run_dir, frame)
    traces = TraceSet(frame, {}, "held-out traces")
    out: dict[str, dict[str, float]] = {}
    oracles: dict[str, float] | None = None  # they depend on the traces and costs only: computed once
    for label, policy in policies.items():
        gammas = np.zeros(traces.count, dtype=int) if policy is None else replay_gammas(policy, traces, max_gamma,
                                                                                          profile)
        scores = replay_scores(traces, profile, max_gamma, gammas, rate="request",  # as the live decode tok/s
                               oracles=oracles is None)
        if oracles is None:
            oracles = {key: scores[key] for key in ORACLE_KEYS}
        out[label] = {**scores, **oracles}
    return out


def _category_lines(table: pd.DataFrame) -> str:
    """The per-category rows in a few columns (``by_category.parquet`` holds them all)."""
    columns = ["method", "category", "prompts", "output_tokens", "decode_s", "time_share", "acceptance_length",
               "decode_speedup", "decode_speedup_ci95_lo", "decode_speedup_ci95_hi", "decode_speedup_verdict"]
    return table[[c for c in columns if c in table]].to_string(index=False, float_format=lambda v: f"{v:.3g}")


def run(cfg: DictConfig, run_dir: Path) -> int:
    from policies.train.ppo import split_requests
    from spectune.measure.point import check_context_fits, requests_of
    from workloads.setup import open_setup

    if not cfg.get("workload"):
        raise SpectuneError("task=evaluate needs a workload: add +workload=it|en|zh|es|mix")
    settings = EvaluateSettings.from_cfg(cfg)
    with open_dict(cfg):
        cfg.workload.num_prompts = settings.train_prompts + settings.heldout_prompts
    setup = open_setup(cfg, "evaluate")
    workload = setup.workload
    train, heldout = split_requests(requests_of(workload.prompts, workload.max_new_tokens, workload.ignore_eos),
                                    settings.train_prompts, settings.heldout_prompts)
    check_context_fits(train + heldout, settings.max_gamma, setup.max_context)
    language = str(cfg.workload.get("language") or setup.workload.name)
    heldout_ids = {r.prompt_id for r in heldout}
    metadata = {**setup.metadata, "task": "evaluate", "settings": asdict(settings),
                "split": {"train": [r.prompt_id for r in train], "heldout": sorted(heldout_ids)}}
    rundir.METADATA.write(run_dir, metadata)
    rows: list[dict[str, Any]] = []
    grids: list[pd.DataFrame] = []
    frames: list[tuple[pd.DataFrame, pd.DataFrame]] = []
    measured_conditions: dict[str, Any] = {}  # per concurrency: what else ran during each held-out repeat
    tunings: list[pd.DataFrame] = []  # the threshold baselines' replay scores per value tried
    tuned_values: dict[str, dict] = {}  # per concurrency: the value each threshold baseline ran with
    per_category: list[pd.DataFrame] = []  # several categories: each method per category against the best fixed γ

    def write() -> None:
        if grids:
            rundir.GRID.write(run_dir, pd.concat(grids, ignore_index=True))
        if frames:
            rundir.REQUESTS.write(run_dir, pd.concat([f[0] for f in frames], ignore_index=True))
            rundir.CYCLES.write(run_dir, pd.concat([f[1] for f in frames], ignore_index=True))
        if rows:
            table = comparison_frame(rows)
            rundir.COMPARISON.write(run_dir, table)
            rundir.COMPARISON_MD.write(run_dir, format_comparison(table) + "\n")
        if measured_conditions:
            rundir.CONDITIONS.write(run_dir, measured_conditions)
        if per_category:
            rundir.BY_CATEGORY.write(run_dir, pd.concat(per_category, ignore_index=True))

    seed = int(cfg.seed)
    for concurrency in settings.concurrency:
        best, grid = _grid_search(setup.engine, train, settings, concurrency, setup.max_context, seed)
        grids.append(grid)
        write()
        grid_csv = rundir.GRID_CSV.named(concurrency=concurrency).write(run_dir, grid) if settings.calibrate else None
        needs_learned = set(LEARNED) & set(settings.policies) or (settings.tune and tunable(settings.policies))
        learned = _trained(cfg, settings, run_dir, concurrency, heldout_ids, grid_csv) if needs_learned else None
        best_label = Method.fixed(best).label
        methods: list[tuple[str, int, dict]] = [(BASELINE, 0, {"name": FIXED})]
        if best:
            methods.append((best_label, best, {"name": FIXED}))
        labels = {BASELINE: BASELINE, best_label: BEST_FIXED}
        fixed = {BASELINE: 0, best_label: best}
        if settings.hindsight:  # every other fixed γ too: the best of them on these prompts is the ceiling
            for gamma in range(1, settings.max_gamma + 1):
                if gamma != best:
                    label = Method.fixed(gamma).label
                    methods.append((label, gamma, {"name": FIXED}))
                    labels[label], fixed[label] = label, gamma
        for name in settings.policies:
            files = learned_files(name, learned, concurrency)
            if name == "acceptance-classifier":
                files = {"weights_path": str(_classifier(learned, seed))}
            node = policy_node(name, settings.params.get(name), **files)
            methods.append((name, settings.max_gamma, node))
            labels[name] = name
        if settings.tune and learned is not None:
            methods, table = _tuned(methods, settings, learned, concurrency)
            if len(table):
                tunings.append(table)
                rundir.TUNING.write(run_dir, pd.concat(tunings, ignore_index=True))
                chosen = table[table["chosen"]]
                tuned_values[f"c{concurrency}"] = {p: {k: v} for p, k, v in zip(chosen["policy"], chosen["parameter"],
                                                                                chosen["value"], strict=True)}
        if settings.noise_floor:  # AR again, as its own method, opposite AR in the rotation: the A/A row
            methods.insert((len(methods) + 1) // 2, (AA_LABEL, 0, {"name": FIXED}))
            labels[AA_LABEL] = AA_POLICY
        log.info("held-out: %d prompts, concurrency %d, %d methods × %d repeats", len(heldout), concurrency,
                 len(methods), settings.repeats)
        block = settings.block_for(concurrency)
        measured = _measure(setup.engine, heldout, methods, concurrency, settings.repeats, settings.warmup,
                            setup.max_context, block)
        summaries, _ = aggregate(measured, seed=seed, unit_size=unit_size_of(concurrency, block))
        measured_conditions[f"c{concurrency}"] = conditions.summary_fields(measured.points)
        conditions.warn_flagged(measured_conditions[f"c{concurrency}"]["conditions"])
        req, cyc = measured.frames()
        frames.append((req.assign(concurrency=concurrency), cyc.assign(concurrency=concurrency)))
        replay = None
        if learned is not None:  # the oracle needs the profile the learned policies were trained with
            nodes = {label: (make_policy(node, gamma) if gamma else None) for label, gamma, node in methods}
            replay = _replay(setup.engine, heldout, concurrency, settings.max_gamma, learned_profile(learned), nodes,
                             run_dir)
        rows += comparison_rows(summaries, req, cyc, measured.points, labels, best_label, language=language,
                                concurrency=concurrency, best_gamma=best, replay=replay, fixed=fixed,
                                unit_size=unit_size_of(concurrency, block))
        if several_categories(req):  # Spec-Bench's view: every method per category, against the best fixed γ
            table = by_category(req, cyc, durations_of(measured.points), baseline=best_label,
                                unit_size=unit_size_of(concurrency, block))
            per_category.append(table.assign(concurrency=concurrency))
            log.info("per category, decode tok/s against the best fixed γ (%s):\n%s", best_label,
                     _category_lines(table))
        write()
        log.info("\n%s", format_comparison(comparison_frame([r for r in rows if r["concurrency"] == concurrency])))
    rundir.METADATA.write(run_dir, finished_metadata(metadata, tuned=tuned_values))
    log.info("results: %s", run_dir)
    return 0
