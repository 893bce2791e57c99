"""`odqa serve`: the pipeline over HTTP (FastAPI; OpenAPI docs at /docs).

    POST /answer {"question": str, "k": int = 10} -> {"extractive", "generated", "passages", "timings"}
    GET  /health -> {"status": "ok", ...}

Models and indexes load once, at start-up. Concurrent requests are batched: a worker takes up to
`max_batch` waiting requests (waiting at most `max_wait_ms` for more after the first), groups them by
k, and runs each group as one pipeline call (one question-encoder batch, one FiD batch), in a thread
so the event loop keeps accepting requests. Bad input is a 422 with pydantic's message; an error
inside the pipeline is a 500 for the requests of that batch only, and the service keeps serving.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field, StrictInt, StrictStr, field_validator

from system.pipeline import MAX_K

log = logging.getLogger(__name__)
MAX_QUESTION_CHARS = 500


class AnswerRequest(BaseModel):
    question: StrictStr = Field(description="the question, 1 to 500 characters")
    k: StrictInt = Field(10, ge=1, le=MAX_K, description="passages to retrieve and read")

    @field_validator("question")
    @classmethod
    def _question(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("question is empty")
        if len(v) > MAX_QUESTION_CHARS:
            raise ValueError(f"question is longer than {MAX_QUESTION_CHARS} characters")
        return v


@dataclass
class _Pending:
    request: AnswerRequest
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class Batcher:
    """Collects requests and answers them in batches of up to `max_batch`."""

    def __init__(self, pipeline, max_batch: int = 16, max_wait_ms: float = 10.0):
        self.pipeline, self.max_batch, self.max_wait = pipeline, max_batch, max_wait_ms / 1000
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.batches = 0

    async def submit(self, request: AnswerRequest) -> dict:
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        await self.queue.put(pending)
        return await pending.future

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
            by_k: dict[int, list[_Pending]] = {}
            for p in batch:
                by_k.setdefault(p.request.k, []).append(p)
            for k, group in by_k.items():
                await self._answer(k, group)

    async def _answer(self, k: int, group: list[_Pending]) -> None:
        self.batches += 1
        try:
            answers = await asyncio.to_thread(self.pipeline.answer, [p.request.question for p in group], k)
        except Exception as e:  # noqa: BLE001 -- one failed batch must not stop the worker
            log.exception("pipeline failed on a batch of %d", len(group))
            for p in group:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        now = time.perf_counter()
        for p, a in zip(group, answers):
            a["timings"] = {**a["timings"], "total_ms": 1000 * (now - p.arrived)}
            if not p.future.done():
                p.future.set_result(a)


def create_app(pipeline, max_batch: int = 16, max_wait_ms: float = 10.0, info: dict | None = None) -> FastAPI:
    batcher = Batcher(pipeline, max_batch, max_wait_ms)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()

    app = FastAPI(title="odqa", description="Open-domain QA: an extractive answer (the top phrase) and a "
                                            "generated one (FiD over the top-k passages).", lifespan=lifespan)
    app.state.batcher = batcher

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "batches": batcher.batches, "max_batch": max_batch, **(info or {})}

    @app.post("/answer")
    async def answer(request: AnswerRequest) -> dict:
        try:
            result = await batcher.submit(request)
        except Exception as e:  # noqa: BLE001
            raise HTTPException(status_code=500, detail=f"internal error: {type(e).__name__}: {e}") from None
        return {key: result[key] for key in ("question", "extractive", "generated", "passages", "timings")}

    return app
