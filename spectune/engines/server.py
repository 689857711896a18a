"""Engines that are servers (llama.cpp, vLLM, SGLang): one server per method, owned by the harness from start to stop.

The part that differs between engines is a small *flavour* (:class:`ServerFlavour`): how a method is checked, the
command that serves it, the health path, the request that streams a completion of token ids, how one streamed event
and the Prometheus text read. Everything else is here, the same for every engine:

- :class:`ManagedServer`: one server process in its own process group (a Ctrl-C on the terminal reaches the harness,
  which stops the servers; never the servers directly), on a free port (or a fixed one), its output in a log file,
  ready when its health path answers 200; stopped with SIGTERM, then SIGKILL, on close, on failure, at exit
  (``atexit``) and, on Linux, when the harness itself dies (``PR_SET_PDEATHSIG``). Its exact command is recorded.
- :func:`stream` sends one request and timestamps every streamed event (Server-Sent Events, ``data: {json}``).
- :class:`ServerEngine`: a :class:`~spectune.engines.base.MeasuringEngine` over a flavour. The servers of every
  method stay up together across the interleaved design (``open``); each (method, repeat) starts on a fresh
  server, restarted when it has served a measured block before, so that nothing a repeat taught a server (an
  n-gram pool, a prefix cache) carries into the next. A block is a closed loop of ``concurrency`` workers, each
  sending its next request when its previous one finished (an open loop sends at the requests' arrival times).

A server that crashes, never becomes ready or finds its port in use fails its method's points with one line naming
the method and the last lines of its log (:class:`ServerFailure`); the other methods go on and the results written
stay. What a server does not report is absent from the rows, never invented.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from spectune.engine.records import Request, RequestRecord, requests_frame, summarise
from spectune.errors import SpectuneError
from spectune.methods import Method
from spectune.run.progress import RunProgress

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
RSS_PERIOD_S = 0.1
LOG_TAIL_LINES = 3
DEATH_GRACE_S = 5.0  # how long a broken stream waits to tell a dead server from a live one


class ServerFailure(RuntimeError):
    """A server crashed, never became ready or could not listen: its method's point fails, the run goes on (and
    exits non-zero at its end). The message is one line naming the method."""


@dataclass
class StreamEvent:
    """What one streamed event carried: the token ids that arrived (``token_ids``; an engine that streams text
    gives a count, ``token_count``), and on the last event (``done``) the engine's own counters where it reports
    them: prompt tokens it evaluated, tokens drafted and accepted, prompt and decode milliseconds. None: not
    reported."""

    token_ids: list[int] = field(default_factory=list)
    token_count: int | None = None  # tokens that arrived; None: len(token_ids)
    done: bool = False
    prompt_tokens: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    prompt_ms: float | None = None
    decode_ms: float | None = None
    finish_reason: str | None = None

    @property
    def count(self) -> int:
        return len(self.token_ids) if self.token_count is None else self.token_count


class ServerFlavour(Protocol):
    """What one server engine says about itself; :class:`ServerEngine` does the rest. ``parse_metrics`` gives
    engine-wide counters by spectune's names (``spec_decode_num_drafts``, ``spec_decode_draft_tokens``,
    ``spec_decode_accepted_tokens``, ``prompt_tokens``, ``generation_tokens``) where per-request ones are missing."""

    health_path: str
    metrics_path: str | None

    def check(self, method: Method) -> None:
        """A one-line SpectuneError when this engine cannot serve ``method`` (unknown type, bad length)."""

    def command(self, method: Method, port: int, threads: int | None, slots: int) -> list[str]:
        """The exact command that serves ``method`` on ``port`` with ``threads`` and ``slots`` parallel requests."""

    def request(self, prompt_ids: list[int], max_tokens: int, sampling: Any, seed: int,
                ignore_eos: bool = False) -> tuple[str, dict]:
        """(path, JSON body) of a streaming completion of ``prompt_ids`` that reports token ids (``ignore_eos``: it
        runs to ``max_tokens``, EOS or not)."""

    def parse_event(self, event: dict) -> StreamEvent:
        """One streamed JSON event."""

    def parse_metrics(self, text: str) -> dict[str, float]:
        """The Prometheus text of ``metrics_path``, as counters by spectune's names."""


# -- one server process -------------------------------------------------------------------------------------------
_LIVE: set[ManagedServer] = set()


def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


atexit.register(_stop_all)


def _child_setup() -> None:
    """In the server's process before exec: a process group of its own, and SIGTERM when the harness dies."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def check_server_settings(port: int | None, ready_timeout_s: float) -> None:
    """The settings every server engine shares, one line each: ``engine.port`` (null: a free port per server) and
    ``engine.ready_timeout_s``."""
    if port is not None and not 1024 <= port <= 65535:
        raise SpectuneError(f"engine.port={port} is invalid: 1024..65535, or null (a free port per server)")
    if not ready_timeout_s > 0:
        raise SpectuneError(f"engine.ready_timeout_s={ready_timeout_s} is invalid: seconds > 0")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return True
    return False


class ManagedServer:
    """One server process for ``method``: started, waited for, restarted, stopped; its log in ``log_path``."""

    def __init__(self, method: Method, flavour: ServerFlavour, *, threads: int | None, slots: int, log_path: Path,
                 port: int | None, ready_timeout_s: float) -> None:
        self.method, self.flavour, self.threads, self.slots = method, flavour, threads, slots
        self.log_path, self.fixed_port, self.ready_timeout_s = log_path, port, ready_timeout_s
        self.port = 0
        self.command: list[str] = []
        self.commands: list[list[str]] = []  # every distinct command it ran (a restart on another port adds one)
        self.proc: subprocess.Popen | None = None
        self.served = False  # measured requests since the last start
        self.starts = 0

    @property
    def label(self) -> str:
        return self.method.label

    def start(self) -> None:
        """Start the server and wait until its health path answers 200 (:class:`ServerFailure` otherwise). A
        restart takes its previous port again where it is free, so that its command stays the same."""
        again = self.port and not self.fixed_port and not port_in_use(self.port)
        self.port = self.fixed_port or (self.port if again else free_port())
        if port_in_use(self.port):
            raise ServerFailure(f"the server for {self.label} cannot start: port {self.port} on {HOST} is in use")
        self.command = self.flavour.command(self.method, self.port, self.threads, self.slots)
        if self.command not in self.commands:
            self.commands.append(self.command)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(f"$ {' '.join(self.command)}\n")
            out.flush()
            try:
                self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, preexec_fn=_child_setup)
            except OSError as err:
                raise ServerFailure(f"the server for {self.label} cannot start: {err}") from None
        _LIVE.add(self)
        self.starts += 1
        self.served = False
        log.info(f"server for {self.label}: pid {self.proc.pid}, port {self.port}: {' '.join(self.command)}")
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                self.stop()
                raise ServerFailure(f"the server for {self.label} exited with code {code} before it was ready: "
                                    f"{self.log_tail()}")
            if self._health() == 200:
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ServerFailure(f"the server for {self.label} was not ready after {self.ready_timeout_s:g} s "
                                    f"(GET {self.flavour.health_path} on port {self.port}): {self.log_tail()}")
            time.sleep(0.1)

    def _health(self) -> int | None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
        try:
            conn.request("GET", self.flavour.health_path)
            return conn.getresponse().status
        except OSError:
            return None
        finally:
            conn.close()

    def alive(self, grace_s: float = 0.0) -> bool:
        """Whether the server process still runs; ``grace_s``: wait that long for one whose connection just broke
        to finish dying (a killed server closes its sockets a moment before it can be reaped)."""
        if self.proc is None:
            return False
        if grace_s:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        return self.proc.poll() is None

    def died(self) -> ServerFailure:
        """The one-line failure of a server that stopped answering."""
        code = self.proc.poll() if self.proc else None
        state = f"exited with code {code}" if code is not None else "stopped answering"
        return ServerFailure(f"the server for {self.label} {state}: {self.log_tail()}")

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 10 s; safe to call twice."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def rss(self) -> int | None:
        """Resident memory of the server's process tree (bytes); None when it is gone."""
        import psutil

        if self.proc is None:
            return None
        try:
            root = psutil.Process(self.proc.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return None

    def get(self, path: str, timeout: float = 10) -> str | None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.read().decode("utf-8", "replace") if response.status == 200 else None
        except OSError:
            return None
        finally:
            conn.close()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        kept = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("$ ")]
        return " | ".join(kept[-lines:]) or "(empty log)"

    def describe(self) -> dict[str, Any]:
        return {"command": self.command, "port": self.port, "log": str(self.log_path), "starts": self.starts,
                **({"commands": self.commands} if len(self.commands) > 1 else {})}


# -- one request --------------------------------------------------------------------------------------------------
@dataclass
class Streamed:
    """What one request gave: (arrival time, event) per event, all times on the caller's clock."""

    sent_s: float
    events: list[tuple[float, StreamEvent]]


def stream(server: ManagedServer, path: str, body: dict, clock: Any, timeout_s: float = 600) -> Streamed:
    """POST ``body`` to ``path`` and read its Server-Sent Events, each timestamped by ``clock()`` as it arrives."""
    conn = http.client.HTTPConnection(HOST, server.port, timeout=timeout_s)
    payload = json.dumps(body).encode()
    try:
        sent = clock()
        conn.request("POST", path, payload, {"Content-Type": "application/json", "Accept": "text/event-stream"})
        response = conn.getresponse()
        if response.status != 200:
            text = response.read().decode("utf-8", "replace").strip().replace("\n", " ")
            raise ServerFailure(f"the server for {server.label} answered {response.status} to {path}: {text[:300]}")
        events: list[tuple[float, StreamEvent]] = []
        while True:
            line = response.readline()
            if not line:
                break
            now = clock()
            text = line.decode("utf-8", "replace").strip()
            if text.startswith("error:"):
                raise ServerFailure(f"the server for {server.label} reported an error: {text[6:].strip()[:300]}")
            if not text.startswith("data:"):
                continue
            data = text[5:].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if isinstance(obj, dict) and "error" in obj:  # an error in the stream is an event of its own
                detail = json.dumps(obj["error"])[:300]
                raise ServerFailure(f"the server for {server.label} reported an error: {detail}")
            event = server.flavour.parse_event(obj)
            events.append((now, event))
            if event.done:
                break
    except (OSError, http.client.HTTPException, ValueError) as err:
        if not server.alive(grace_s=DEATH_GRACE_S):
            raise server.died() from None
        raise ServerFailure(f"the request to the server for {server.label} failed: {type(err).__name__}: {err}") \
            from None
    finally:
        conn.close()
    if not events or not events[-1][1].done:
        raise server.died() if not server.alive(grace_s=DEATH_GRACE_S) else ServerFailure(
            f"the server for {server.label} ended a stream without its last event: {server.log_tail()}")
    return Streamed(sent, events)


def record_of(request: Request, got: Streamed) -> tuple[RequestRecord, dict[str, Any]]:
    """The request's record and the engine's own counters: arrival is the request's scheduled time in an open loop,
    its send time in a closed one; admission is its send time; one token time per token, when its event arrived."""
    arrival = request.arrival_s if request.arrival_s is not None else got.sent_s
    rec = RequestRecord(request.request_id, request.prompt_id, request.language, len(request.input_ids),
                        arrival, request.category, admitted_s=got.sent_s)
    for at, event in got.events:
        rec.output_ids.extend(event.token_ids)
        rec.token_times_s.extend([at] * event.count)
    if rec.token_times_s:
        rec.first_token_s = rec.token_times_s[0]
    rec.finish_s = got.events[-1][0]
    last = got.events[-1][1]
    drafted, accepted = last.drafted, last.accepted
    # the last event that names it: vLLM's closing usage chunk follows the chunk that carries it
    finish = next((e.finish_reason for _, e in reversed(got.events) if e.finish_reason is not None), None)
    counters = {"engine_prompt_tokens": last.prompt_tokens, "drafted_tokens": drafted, "accepted_tokens": accepted,
                "acceptance_rate": accepted / drafted if drafted and accepted is not None else None,
                "engine_prompt_ms": last.prompt_ms, "engine_decode_ms": last.decode_ms,
                "finish_reason": finish}
    if last.prompt_tokens is not None and last.prompt_tokens != len(request.input_ids):
        raise ServerFailure(f"the server evaluated {last.prompt_tokens} prompt tokens for prompt "
                            f"{request.prompt_id!r}, {len(request.input_ids)} were sent")
    return rec, counters


def no_cycles() -> pd.DataFrame:
    """A server's cycle rows: none (it reports per-request totals at most), keyed by method like every frame."""
    return pd.DataFrame({"method": pd.Series([], dtype=object)})


class _RssWatch:
    """The server's peak resident memory over a block, sampled every RSS_PERIOD_S by a thread."""

    def __init__(self, server: ManagedServer) -> None:
        self.server, self.peak, self._stop = server, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.rss() or 0)
            self._stop.wait(RSS_PERIOD_S)

    def __enter__(self) -> _RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.server.rss() or 0)


# -- the engine ---------------------------------------------------------------------------------------------------
class ServerEngine:
    """A :class:`~spectune.engines.base.MeasuringEngine` over a :class:`ServerFlavour`: one server per method.

    ``threads``: the server's CPU threads (None: its default); ``slots``: requests it serves in parallel (the
    largest concurrency measured); ``port``: None for a free port per server, or the first of consecutive fixed
    ports; ``log_dir``: where each server's log goes; ``sampling`` and ``seed``: every request's law and the seed
    a request's own is derived from."""

    engine: str  # a subclass names its engine (``engine = "<name>"``); this base is in no catalogue
    in_process = False  # the models run in the servers; this process needs the target's tokenizer only

    def __init__(self, flavour: ServerFlavour, *, sampling: Any, seed: int, threads: int | None, slots: int,
                 log_dir: Path, port: int | None = None, ready_timeout_s: float = 120.0,
                 request_timeout_s: float = 600.0) -> None:
        self.flavour, self.sampling, self.seed = flavour, sampling, int(seed)
        self.threads, self.slots, self.log_dir, self.port = threads, slots, Path(log_dir), port
        self.ready_timeout_s, self.request_timeout_s = ready_timeout_s, request_timeout_s
        self.servers: dict[str, ManagedServer] = {}
        self.failures: dict[str, ServerFailure] = {}

    def check(self, methods: Sequence[Method]) -> None:
        if self.slots < 1:
            raise SpectuneError(f"slots={self.slots} is invalid for engine={self.engine}: an integer >= 1")
        for method in methods:
            self.flavour.check(method)

    def open(self, methods: Sequence[Method]) -> None:
        """Start one server per method (the A/A duplicate of AR gets its own) and warm each up; a server that
        fails is recorded and fails its method's points (:meth:`measure`), the others go on."""
        self.check(methods)
        for i, method in enumerate(methods):
            name = method.label.replace(":", "_").replace("=", "").replace("#", "_")
            server = ManagedServer(method, self.flavour, threads=self.threads, slots=self.slots,
                                   log_path=self.log_dir / f"{name}.log", ready_timeout_s=self.ready_timeout_s,
                                   port=None if self.port is None else self.port + i)
            self.servers[method.label] = server
            try:
                server.start()
                self._warm(server, None)
            except ServerFailure as err:
                self.failures[method.label] = err  # its points fail, each with this line; the others go on
                log.info(f"{err} (its points will fail)")

    def _warm(self, server: ManagedServer, requests: list[Request] | None, count: int = 1) -> None:
        """``count`` requests of one new token each (a prompt's prefill and one decode step): no generated text
        reaches an n-gram pool that outlives a request. ``requests`` None: a short fixed prompt."""
        prompts = [r.input_ids for r in (requests or [])[:count]] or [[1, 2, 3, 4]]
        for ids in prompts:
            path, body = self.flavour.request(list(ids), 1, self.sampling, self.seed)
            stream(server, path, body, time.perf_counter, self.request_timeout_s)

    def _server(self, method: Method) -> ManagedServer:
        if method.label in self.failures:
            raise self.failures[method.label]
        if method.label not in self.servers:
            raise ValueError(f"engine={self.engine}: {method.label} was not opened")
        server = self.servers[method.label]
        if not server.alive():
            self.failures[method.label] = server.died()
            raise self.failures[method.label]
        return server

    def measure(self, requests: list[Request], method: Method, *, concurrency: int, warmup: int,
                first_block: bool, progress: RunProgress | None = None
                ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        server = self._server(method)
        if concurrency > self.slots:
            raise ValueError(f"concurrency {concurrency} exceeds the {self.slots} slots the servers were started with")
        try:
            if first_block and server.served:  # a fresh server per (method, repeat): no pool carried over
                server.restart()
                self._warm(server, None)
            if first_block and warmup:
                self._warm(server, requests, warmup)
            before = self._counters(server)
            with _RssWatch(server) as rss:
                records, counters = self._run(server, requests, concurrency)
            after = self._counters(server)
            if progress is not None:  # the block's requests at once: the client's threads do not report one by one
                progress.advance(len(requests))
        except ServerFailure as err:
            self.failures[method.label] = err
            raise
        server.served = True
        req = requests_frame(records)
        for key in counters[0] if counters else ():
            values = [c[key] for c in counters]
            if any(v is not None for v in values):
                req[key] = values
        engine_counters = None
        if before is not None and after is not None:
            engine_counters = {k: after[k] - before.get(k, 0.0) for k in after}
        summary = {"method": method.label, "gamma": method.gamma, "status": "ok",
                   **summarise(req, pd.DataFrame(), engine_counters), "peak_rss_bytes": rss.peak or None,
                   "memory_method": f"{self.engine} server process RSS (psutil), sampled every {RSS_PERIOD_S:g} s",
                   "policy": None}
        if engine_counters is not None:
            summary["engine_counters"] = engine_counters
        req.insert(0, "method", method.label)
        req.insert(1, "gamma", method.gamma)
        return req, no_cycles(), summary

    def _counters(self, server: ManagedServer) -> dict[str, float] | None:
        if self.flavour.metrics_path is None:
            return None
        text = server.get(self.flavour.metrics_path)
        return self.flavour.parse_metrics(text) if text is not None else None

    def _run(self, server: ManagedServer, requests: list[Request], concurrency: int
             ) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
        """The block: a closed loop of ``concurrency`` workers (or sends at the requests' arrival times)."""
        start = time.perf_counter()
        open_loop = any(r.arrival_s is not None for r in requests)

        def clock() -> float:
            return time.perf_counter() - start

        def one(request: Request) -> tuple[RequestRecord, dict[str, Any]]:
            if open_loop:
                time.sleep(max(0.0, (request.arrival_s or 0.0) - clock()))
            seed = (self.seed + abs(request.request_id)) % (2**31)
            path, body = self.flavour.request(list(request.input_ids), request.max_new_tokens, self.sampling, seed,
                                              ignore_eos=request.ignore_eos)
            return record_of(request, stream(server, path, body, clock, self.request_timeout_s))

        workers = len(requests) if open_loop else concurrency
        pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=f"{self.engine}-client")
        try:
            done = list(pool.map(one, requests))
        except BaseException:  # a failed request or a signal: stop the server, so that no stream keeps a worker
            server.stop()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return [d[0] for d in done], [d[1] for d in done]

    def describe(self) -> dict[str, Any]:
        return {"engine": self.engine, "threads": self.threads, "slots": self.slots,
                "servers": {label: s.describe() for label, s in self.servers.items()},
                "failed": {label: str(err) for label, err in self.failures.items()}}

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()

    def __enter__(self) -> ServerEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
