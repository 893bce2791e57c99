"""Load test of `odqa serve` on loopback: the same requests against a server that batches (up to
--max-batch) and one that answers one request at a time, in one run. Prints throughput, p50/p95/p99
latency and the failed-request count of each.

    python scripts/load_test.py --index RUN/index --model RUN/best --reader READER/best \\
        [--doc-index DHR/doc-index --doc-model DHR/doc/best] [--requests 256] [--concurrency 32] [--k 10]
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import threading
import time

import httpx
import numpy as np
import uvicorn

from common.defaults import fill_defaults
from common.questions import load_questions
from system.cli import _phrase_searcher
from system.pipeline import Pipeline
from system.serve import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join()


async def fire(url: str, questions: list[str], concurrency: int, k: int) -> tuple[list[float], int, float]:
    limit = asyncio.Semaphore(concurrency)
    latencies, failed = [], 0

    async def one(client: httpx.AsyncClient, q: str) -> None:
        nonlocal failed
        async with limit:
            start = time.perf_counter()
            try:
                r = await client.post(f"{url}/answer", json={"question": q, "k": k})
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            failed += not ok

    async with httpx.AsyncClient(timeout=600) as client:
        await client.post(f"{url}/answer", json={"question": questions[0], "k": k})  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(one(client, q) for q in questions))
        return latencies, failed, time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", default=None, help="default: the default pipeline's (`odqa demo`)")
    p.add_argument("--model", default=None)
    p.add_argument("--reader", default=None)
    p.add_argument("--doc-index", default=None)
    p.add_argument("--doc-model", default=None)
    p.add_argument("--no-prefilter", action="store_true")
    p.add_argument("--top-docs", type=int, default=100)
    p.add_argument("--lam", type=float, default=None)
    p.add_argument("--nprobe", type=int, default=64)
    p.add_argument("--corpus", default=None)
    p.add_argument("--questions", default="nq-test")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()
    fill_defaults(args, reader=True)
    pipeline = Pipeline.load(_phrase_searcher(args), args.reader)
    questions = [q.question for q in load_questions(args.questions, limit=args.requests)]
    print(f"{len(questions)} requests of {args.questions}, {args.concurrency} concurrent, k = {args.k}, loopback")
    print("| server | requests/s | p50 ms | p95 ms | p99 ms | failed |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, max_batch in ((f"batched (up to {args.max_batch})", args.max_batch), ("one at a time", 1)):
        with ServerThread(create_app(pipeline, max_batch=max_batch, max_wait_ms=10)) as url:
            latencies, failed, seconds = asyncio.run(fire(url, questions, args.concurrency, args.k))
        p50, p95, p99 = (1000 * np.percentile(latencies, q) for q in (50, 95, 99))
        print(f"| {label} | {len(questions) / seconds:.2f} | {p50:.0f} | {p95:.0f} | {p99:.0f} | {failed} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
