"""`odqa serve`: the pipeline over HTTP (FastAPI; OpenAPI docs at /docs).

    POST /answer {"question": str, "k": int = 10, "settings": {...} = {}}
                   -> {"extractive", "generated", "passages", "timings"}
    GET  /health   200 {"status": "ready", ...}; 503 {"status": "loading"} while the models load
    GET  /metrics  Prometheus text: requests by status, queue depth, batch sizes, stage latencies
    GET  /         a page to ask questions on (system/static/index.html; ?q=...&k=... asks at once)

The server starts at once and loads the models in a thread, so /health can say it is loading.
Concurrent requests are batched: a worker takes up to `max_batch` waiting requests (waiting at most
`max_wait_ms` for more after the first), groups them by k, and runs each group as one pipeline call
(one question-encoder batch, one FiD batch) in a thread, so the event loop keeps accepting requests.

Under load it sheds rather than queues without end: a request is answered 429 at once, with
Retry-After, when `max_queue` requests are waiting, or when the work ahead of it (requests waiting and
in flight, times the measured seconds a request) exceeds `max_queue_s`. One not answered within
`timeout_s` gets 503 and is dropped from its batch if the batch has not started (a started batch goes
on for the others). Bad input is a 422 with pydantic's message, repeating at most 100 characters of
the input; a body over 16 KB is a 413, counted as it arrives whatever Content-Length says. A client
must send each request whole within the request timeout of starting it (`TimedH11Protocol`), or its
connection is closed; a request whose client has gone before its batch starts is never computed. "settings" changes search or reading settings for one request
(`SearchConfig`'s and `ReaderSettings`' fields, as `Pipeline.ask` takes them), within SETTING_LIMITS;
requests are batched only with those of the same k and settings. An error inside the pipeline is a 500 for the bad request only:
a batch that raises is answered again one request at a time. On shutdown, requests in flight are
answered before the worker stops.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h11
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator
from uvicorn.protocols.http.h11_impl import H11Protocol

from odqa.common.io import InputError
from odqa.common.questions import checked_question
from odqa.common.results import Answer
from odqa.common.settings import from_flat
from odqa.common.timings import PastDeadline, deadline
from odqa.reader.args import ReaderSettings
from odqa.retriever.search_config import SearchConfig
from odqa.system.args import ServeConfig
from odqa.system.pipeline import MAX_K, READER_SETTINGS, SEARCH_SETTINGS, split_settings

log = logging.getLogger(__name__)
MAX_QUESTION_CHARS = 500
MAX_BODY_BYTES = 16_384          # a question of 500 characters is at most 2 KB of JSON
ECHO_CHARS = 100                 # how much of a refused input a 422 repeats
REQUEST_TIMEOUT_ENV = "ODQA_SERVE_REQUEST_TIMEOUT_S"   # how `serve` gives it to each worker's protocol
STATIC = Path(__file__).parent / "static"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# What one request may ask for: each setting's ceiling, so that no request costs the server much more
# than its k allows (a deeper vote or pre-filter searches more; beams and tokens decode longer).
# nprobe is the index's, set when it opens; batch_size is the server's own batching.
SETTING_LIMITS = {"top_docs": 1000, "rerank_depth": MAX_K, "answer_depth": MAX_K, "memory_neighbours": 20,
                  "max_answer_tokens": 20, "num_beams": 8, "max_new_tokens": 64, "text_maxlength": 512}
REQUEST_SETTINGS = tuple(n for n in SEARCH_SETTINGS + READER_SETTINGS if n not in ("nprobe", "batch_size"))


class AnswerRequest(BaseModel):
    question: StrictStr = Field(description="the question, 1 to 500 characters")
    k: StrictInt = Field(10, ge=1, le=MAX_K, description="passages to retrieve and read")
    settings: dict[str, StrictBool | StrictInt | StrictFloat | StrictStr] = Field(
        default_factory=dict, description="search or reading settings for this request: " + ", ".join(REQUEST_SETTINGS))

    @field_validator("settings")
    @classmethod
    def _settings(cls, v: dict) -> dict:
        unknown = sorted(set(v) - set(REQUEST_SETTINGS))
        if unknown:
            raise ValueError(f"not request settings: {', '.join(unknown)[:ECHO_CHARS]} (they are: {', '.join(REQUEST_SETTINGS)})")
        over = [f"{n} at most {SETTING_LIMITS[n]}" for n in v if n in SETTING_LIMITS and v[n] > SETTING_LIMITS[n]]
        if over:
            raise ValueError(f"settings over this server's limits: {', '.join(over)}")
        search, read = split_settings(v)
        try:   # the settings' own ranges and kinds, as the flags and odqa.load check them
            from_flat(SearchConfig, search), from_flat(ReaderSettings, read)
        except InputError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("question")
    @classmethod
    def _question(cls, v: str) -> str:
        try:
            return checked_question(v, max_chars=MAX_QUESTION_CHARS)
        except InputError as e:
            raise ValueError(str(e)) from None


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (one per app). Under `serve --workers
    N` (PROMETHEUS_MULTIPROC_DIR set) each worker writes its values to that directory and /metrics
    reads every worker's: counters and histograms summed, the queue summed over live workers, ready
    the least of them, and per worker (labelled with its pid) whether it is ready and how many
requests it has answered."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("odqa_requests", "POST /answer requests by HTTP status", ["status"], registry=r)
        self.queue_depth = Gauge("odqa_queue_depth", "requests waiting for a batch", registry=r,
                                 multiprocess_mode="livesum")
        self.ready = Gauge("odqa_ready", "1 once the models are loaded", registry=r, multiprocess_mode="livemin")
        self.worker_ready = Gauge("odqa_worker_ready", "1 once this worker's models are loaded", registry=r,
                                  multiprocess_mode="liveall")
        self.worker_requests = Gauge("odqa_worker_requests", "POST /answer requests this worker has answered",
                                     registry=r, multiprocess_mode="liveall")
        self.batch_size = Histogram("odqa_batch_size", "questions answered together", registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.stage = Histogram("odqa_stage_seconds", "seconds a batch spends in each stage", ["stage"], registry=r,
                               buckets=LATENCY_BUCKETS)
        self.gone = Counter("odqa_requests_gone", "POST /answer requests whose client went away before they were "
                            "answered; those whose batch had not started were never computed", registry=r)
        self.stopped = Counter("odqa_requests_stopped", "POST /answer requests whose computation was stopped "
                               "past their timeout", registry=r)
        self.latency = Histogram("odqa_request_seconds", "seconds from arrival to answer, answered requests",
                                 registry=r, buckets=LATENCY_BUCKETS)

    def exposed(self) -> CollectorRegistry:
        """What /metrics shows: this registry, or every worker's values under `serve --workers N`."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return self.registry
        every = CollectorRegistry()
        multiprocess.MultiProcessCollector(every)
        return every


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def _until_gone(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Overloaded(Exception):
    def __init__(self, retry_after: int):
        self.retry_after = retry_after


@dataclass
class _Pending:
    request: AnswerRequest
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    abandoned: bool = False      # timed out before its batch started


class Gate:
    """Pure ASGI, in front of FastAPI: a POST /answer that will be refused for its size (413, 411) or
    because the server is overloaded (429) is answered here, before its body is parsed, routed or
    validated, so shedding load costs the server little CPU just when it has none to spare. The body is
    counted as it arrives and refused at MAX_BODY_BYTES, whatever Content-Length promised (a chunked body
    carries its own length). Counts every /answer response by status."""

    def __init__(self, app, batcher: "Batcher", metrics: Metrics, ready: Callable[[], bool]):
        self.app, self.batcher, self.metrics, self.ready = app, batcher, metrics, ready

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/answer":
            return await self.app(scope, receive, send)
        if scope["method"] == "POST":
            headers = dict(scope["headers"])
            size = headers.get(b"content-length", b"")
            chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
            if not chunked and (not size.isdigit() or int(size) > MAX_BODY_BYTES):
                return await self._refuse(send, 413 if size else 411, f"a request body is at most {MAX_BODY_BYTES} "
                                                                      "bytes, with its Content-Length")
            if self.ready() and self.batcher.overloaded():
                return await self._refuse(send, 429, "too many requests are waiting",
                                          [(b"retry-after", str(self.batcher.retry_after()).encode())])
            body = await self._body(receive)
            if body is None:
                return await self._refuse(send, 413, f"a request body is at most {MAX_BODY_BYTES} bytes")
            receive = self._replay(body, receive)

        arrived, status = time.perf_counter(), None

        async def counted(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self._count(status)
                if status == 200:   # the latency of the answers clients got, so its count is the 200s'
                    self.metrics.latency.observe(time.perf_counter() - arrived)
            await send(message)
        try:
            await self.app(scope, receive, counted)
        except Exception:
            if status is None:   # starlette's outermost middleware answers it 500, outside this count
                self._count(500)
            raise

    def _count(self, status: int) -> None:
        self.metrics.requests.labels(str(status)).inc()
        self.metrics.worker_requests.inc()

    @staticmethod
    async def _body(receive) -> bytes | None:
        """The whole body, or None once it passes MAX_BODY_BYTES (the rest is never read: the server closes
        the connection after the 413)."""
        parts, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":   # the client went away: an empty body, answered to no one
                return b""
            parts.append(message.get("body", b""))
            total += len(parts[-1])
            if total > MAX_BODY_BYTES:
                return None
            if not message.get("more_body", False):
                return b"".join(parts)

    @staticmethod
    def _replay(body: bytes, receive):
        """The app's `receive`: the body read here, then the server's own (which reports a disconnect)."""
        sent = False

        async def replayed():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        return replayed

    async def _refuse(self, send, status: int, detail: str, headers: list | None = None) -> None:
        self._count(status)
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), *(headers or [])]})
        await send({"type": "http.response.body", "body": body})


class Batcher:
    """Collects requests and answers them in batches of up to `max_batch`."""

    def __init__(self, metrics: Metrics, max_batch: int = 16, max_wait_ms: float = 10.0, max_queue: int = 64,
                 timeout_s: float = 30.0, max_queue_s: float | None = None):
        self.metrics, self.max_batch, self.max_wait = metrics, max_batch, max_wait_ms / 1000
        self.max_queue, self.timeout_s, self.max_queue_s = max_queue, timeout_s, max_queue_s
        self.pipeline = None
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.batches, self.in_flight = 0, 0
        self.request_s: float | None = None     # running mean of a batch's seconds per request

    def work_ahead_s(self) -> float:
        """Expected seconds before a request arriving now starts: the requests ahead of it times the
        measured seconds a request (the mean falls with batch size, little on a CPU, much on a GPU)."""
        return (self.queue.qsize() + self.in_flight) * (self.request_s or 0.0)

    def retry_after(self) -> int:
        return max(1, math.ceil(self.work_ahead_s()))

    def overloaded(self) -> bool:
        return self.queue.qsize() >= self.max_queue or (
            self.max_queue_s is not None and self.work_ahead_s() > self.max_queue_s)

    async def submit(self, request: AnswerRequest, disconnected: Callable | None = None) -> dict:
        """The answer to `request`. `disconnected`: awaited beside it (the server's `receive`, which
        returns once the client has gone); a request whose client goes is dropped from its batch if the
        batch has not started, and raises ClientGone."""
        if self.overloaded():
            raise Overloaded(self.retry_after())
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        self.queue.put_nowait(pending)
        self.metrics.queue_depth.set(self.queue.qsize())
        answered = asyncio.ensure_future(asyncio.shield(pending.future))
        gone = asyncio.ensure_future(_until_gone(disconnected)) if disconnected is not None else None
        try:
            done, _ = await asyncio.wait({answered} | ({gone} if gone else set()), timeout=self.timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if gone is not None:
                gone.cancel()
        if answered in done:
            return answered.result()
        answered.cancel()
        pending.abandoned = True
        if gone is not None and gone in done:
            self.metrics.gone.inc()
            raise ClientGone()
        raise asyncio.TimeoutError()

    async def run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            deadline = time.perf_counter() + self.max_wait
            while len(batch) < self.max_batch:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), left))
                except asyncio.TimeoutError:
                    break
            self.metrics.queue_depth.set(self.queue.qsize())
            alike: dict[tuple, list[_Pending]] = {}   # one pipeline call answers one k and one set of settings
            for p in batch:
                alike.setdefault((p.request.k, tuple(sorted(p.request.settings.items()))), []).append(p)
            for (k, _), group in alike.items():
                await self._answer(k, group)

    def _compute(self, until: float, questions: list[str], k: int, settings: dict) -> list[dict]:
        with deadline(until):
            return self.pipeline.answer(questions, k, **settings)

    async def _answer(self, k: int, group: list[_Pending]) -> None:
        group = [p for p in group if not p.abandoned]
        if not group:
            return
        self.batches += 1
        self.metrics.batch_size.observe(len(group))
        start = time.perf_counter()
        self.in_flight = len(group)
        # the batch stops at its next stage or decoding step once the last of its requests has been answered
        # 503 for its timeout: once, the most costly request the limits allow computed on for 40 s after
        # its 503 while every other client got 429s
        until = max(p.arrived for p in group) + self.timeout_s
        try:
            answers = await asyncio.to_thread(self._compute, until, [p.request.question for p in group], k,
                                              group[0].request.settings)
        except PastDeadline:
            self.in_flight = 0
            self.metrics.stopped.inc(len(group))
            log.info("stopped a batch of %d: every request in it was past its timeout", len(group))
            return
        except Exception as e:  # noqa: BLE001 -- one failed batch must not stop the worker
            self.in_flight = 0
            if len(group) > 1:
                # Isolate the failure: answer each request alone, so only a bad one fails.
                log.warning("a batch of %d failed (%s: %s); answering its requests one at a time",
                            len(group), type(e).__name__, e)
                for p in group:
                    await self._answer(k, [p])
                return
            log.exception("pipeline failed on a request")
            if not group[0].future.done():
                group[0].future.set_exception(e)
            return
        now = time.perf_counter()
        self.in_flight = 0
        per = (now - start) / len(group)
        self.request_s = per if self.request_s is None else 0.8 * self.request_s + 0.2 * per
        t = answers[0]["timings"] if answers else {}
        for stage in ("retrieve", "read"):
            if f"{stage}_ms" in t:
                self.metrics.stage.labels(stage).observe(t[f"{stage}_ms"] / 1000)
        for p, a in zip(group, answers):
            a["timings"] = {**a["timings"], "total_ms": 1000 * (now - p.arrived)}
            if not p.future.done():
                p.future.set_result(a)


def create_app(pipeline=None, max_batch: int = 16, max_wait_ms: float = 10.0, max_queue: int = 64,
               timeout_s: float = 30.0, max_queue_s: float | None = None, info: dict | None = None,
               load: Callable[[], object] | None = None) -> FastAPI:
    """The service over `pipeline`, or over what `load()` returns: then the app answers /health with
    "loading" until `load` (run in a thread at start-up) is done."""
    if (pipeline is None) == (load is None):
        raise ValueError("give a pipeline or a function that loads one")
    metrics = Metrics()
    batcher = Batcher(metrics, max_batch, max_wait_ms, max_queue, timeout_s, max_queue_s)
    state = {"status": "loading", "error": None}

    def set_ready(p) -> None:
        batcher.pipeline = p
        state["status"] = "ready"
        metrics.ready.set(1)
        metrics.worker_ready.set(1)

    def load_in_thread() -> None:
        try:
            set_ready(load())
        except Exception as e:  # noqa: BLE001 -- reported by /health; the process stays up to say so
            log.exception("loading the pipeline failed")
            state.update(status="failed", error=f"{type(e).__name__}: {e}")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if load is None:
            set_ready(pipeline)
        else:
            threading.Thread(target=load_in_thread, name="odqa-load", daemon=True).start()
        worker = asyncio.create_task(batcher.run())
        yield
        # The server has stopped taking requests and waited for those in flight; nothing is left to batch.
        worker.cancel()

    app = FastAPI(title="odqa", description="Open-domain QA: an extractive answer (the phrase the top passages vote "
                                            "for) and a generated one (FiD over the top-k passages).", lifespan=lifespan)
    app.state.batcher, app.state.metrics = batcher, metrics

    @app.exception_handler(RequestValidationError)
    async def refused(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            err = {k: v for k, v in err.items() if k != "ctx"}
            if "input" in err:
                shown = err["input"] if isinstance(err["input"], (str, int, float, bool, type(None))) else str(err["input"])
                if isinstance(shown, float) and not math.isfinite(shown):
                    shown = str(shown)   # JSON has no NaN or Infinity: echoed as one, the 422 would be a 500
                if isinstance(shown, str):
                    # Never echo megabytes back, nor text that cannot be encoded (a lone surrogate).
                    cut = shown[:ECHO_CHARS] + ("..." if len(shown) > ECHO_CHARS else "")
                    shown = cut.encode("utf-8", "backslashreplace").decode("utf-8")
                err["input"] = shown
            errors.append(err)
        return JSONResponse({"detail": errors}, status_code=422)

    app.add_middleware(Gate, batcher=batcher, metrics=metrics, ready=lambda: state["status"] == "ready")

    @app.get("/health")
    async def health():
        body = {"status": state["status"], "batches": batcher.batches, "queue": batcher.queue.qsize(),
                "max_batch": max_batch, "max_queue": max_queue, "max_queue_s": max_queue_s, "timeout_s": timeout_s,
                **(info or {})}
        if state["error"]:
            body["error"] = state["error"]
        return JSONResponse(body, status_code=200 if state["status"] == "ready" else 503)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.exposed()), media_type=CONTENT_TYPE_LATEST)

    # The response is an `odqa.Answer` (its schema at /docs), less the memory's neighbours: which training
    # questions lent their answers is the operator's to see (`odqa ask`), not every client's.
    @app.post("/answer", response_model=Answer, response_model_exclude={"memory"})
    async def answer(request: AnswerRequest, http: Request) -> dict:
        if state["status"] != "ready":
            raise HTTPException(status_code=503, detail=f"the service is {state['status']}",
                                headers={"Retry-After": "5"})
        try:
            result = await batcher.submit(request, http.receive)
        except Overloaded as e:
            raise HTTPException(status_code=429, detail="too many requests are waiting",
                                headers={"Retry-After": str(e.retry_after)}) from None
        except ClientGone:   # nobody is there to read it
            raise HTTPException(status_code=499, detail="the client closed the connection") from None
        except asyncio.TimeoutError:
            raise HTTPException(status_code=503, detail=f"not answered within {timeout_s:g} s",
                                headers={"Retry-After": str(batcher.retry_after())}) from None
        except Exception as e:  # noqa: BLE001
            raise HTTPException(status_code=500, detail=f"internal error: {type(e).__name__}: {e}") from None
        return {key: result[key] for key in ("question", "extractive", "generated", "passages", "timings")}

    return app


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request: a client must send its request
    line, headers and body within `serve --request-timeout-s` (ServeConfig's) of connecting or of
    its previous answer, or the connection is closed. uvicorn has no such timeout: its keep-alive
    timeout covers only the wait between requests and stops at the first byte, so one header byte a
    second, or half a body, held a connection open for as long as the client liked."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()     # the request is in whole (or the connection is ending)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        default = ServeConfig.__dataclass_fields__["request_timeout_s"].default
        self._deadline = self.loop.call_later(float(os.environ.get(REQUEST_TIMEOUT_ENV, default)), self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.info("closing a connection from %s: no whole request within the request timeout", self.client)
            self.transport.close()
