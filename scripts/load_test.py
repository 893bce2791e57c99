"""Load test of `odqa serve` on loopback: one server process, closed-loop clients at 1, 8, 32 and 128
concurrent. For each level: throughput, p50/p99 latency of the accepted requests started after the
level's warm-up (as the clients see it, and from arrival to answer inside the server), the slowest
request of the warm-up, the 429s (shed load: the client waits the Retry-After, at most a second, and
goes on), other failures, and the server's RSS before and after.

    python scripts/load_test.py [--levels 1 8 32 128] [--seconds 30] [--k 10] [serve flags: --max-batch ...]

The server is `odqa serve` on the default pipeline (`odqa demo`) unless --index/--model/--reader name
others; it is stopped with SIGTERM at the end, as a service manager would. Unless --no-pin, the clients
run on a core of their own and the server on the others (`--threads` to match), so that the load
generator, which would be another machine, does not take the server's CPU or wait for it.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import httpx
import numpy as np

from odqa.common.questions import load_questions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def level(url: str, questions: list[str], clients: int, seconds: float, k: int, warmup: float) -> dict:
    """`clients` closed-loop clients for `seconds`: each sends its next question when it has an answer."""
    latencies, starts, served, shed, failed, done = [], [], [], 0, 0, 0
    why = Counter()   # what each failure was: an HTTP status or an exception's name
    statuses = Counter()   # every response the clients got, to check the server's /metrics against
    t0 = time.perf_counter()
    stop = t0 + seconds

    async def client(i: int, http: httpx.AsyncClient) -> None:
        nonlocal shed, failed, done
        n = i
        while time.perf_counter() < stop:
            q = questions[n % len(questions)]
            n += clients
            start = time.perf_counter()
            try:
                r = await http.post(f"{url}/answer", json={"question": q, "k": k})
            except httpx.HTTPError as e:
                failed += 1
                why[type(e).__name__] += 1
                continue
            statuses[r.status_code] += 1
            if r.status_code == 200:
                latencies.append(time.perf_counter() - start)
                starts.append(start - t0)
                served.append(r.json()["timings"]["total_ms"] / 1000)   # arrival to answer, in the server
                done += 1
            elif r.status_code == 429:
                shed += 1
                await asyncio.sleep(min(1.0, float(r.headers.get("retry-after", 1))))
            else:
                failed += 1
                why[f"HTTP {r.status_code}: {r.text[:120]}"] += 1

    start = time.perf_counter()
    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    took = time.perf_counter() - start
    pct = lambda xs, q: 1000 * float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
    # Requests started during the first `warmup` seconds (all clients connecting at once) are run but not
    # measured: the table is the steady state; the warm-up's slowest is reported beside it.
    steady = [(x, v) for x, t, v in zip(latencies, starts, served) if t >= warmup]
    ramp = [x for x, t in zip(latencies, starts) if t < warmup]
    return {"clients": clients, "answered": done, "per_s": done / took, "p50": pct([x for x, _ in steady], 50),
            "p99": pct([x for x, _ in steady], 99), "server_p50": pct([v for _, v in steady], 50),
            "server_p99": pct([v for _, v in steady], 99), "shed": shed, "failed": failed, "why": dict(why), "measured": len(steady),
            "warmup_max": 1000 * max(ramp) if ramp else float("nan"), "statuses": statuses}


def counted_by_server(url: str) -> tuple[Counter, float]:
    """The server's /metrics: its POST /answer responses by status, and its latency histogram's count."""
    from prometheus_client.parser import text_string_to_metric_families
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    by_status = Counter({int(x.labels["status"]): int(x.value) for x in families["odqa_requests"].samples
                         if x.name.endswith("_total")})
    return by_status, sum(x.value for x in families["odqa_request_seconds"].samples if x.name.endswith("_count"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--seconds", type=float, default=30.0, help="each level's duration (default 30)")
    p.add_argument("--warmup-s", type=float, default=5.0, help="requests started in each level's first seconds, "
                                                                   "while every client connects at once, are not "
                                                                   "measured (default 5)")
    p.add_argument("--questions", default="nq-test")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let server and clients share every core (default: the clients get a core of their own and "
                        "the server the rest, with --threads to match, as if the load came from another machine)")
    p.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                   help="the rest goes to `odqa serve` (e.g. --max-batch 16 --max-queue 32 --index ...)")
    args = p.parse_args()
    questions = [q.question for q in load_questions(args.questions, limit=2000)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cores = sorted(os.sched_getaffinity(0))
    pinned = args.pin and len(cores) >= 2
    server_cores, client_cores = (cores[:-1], cores[-1:]) if pinned else (cores, cores)
    serve_args = list(args.serve_args)
    if pinned and "--threads" not in serve_args:
        serve_args += ["--threads", str(len(server_cores))]
    server = subprocess.Popen([sys.executable, "-m", "odqa.system.cli", "-q", "serve", "--port", str(port), *serve_args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: os.sched_setaffinity(0, server_cores))
    os.sched_setaffinity(0, client_cores)
    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"odqa serve exited: {server.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        warm = httpx.post(f"{url}/answer", json={"question": questions[0], "k": args.k}, timeout=120)
        health = httpx.get(f"{url}/health").json()
        before = rss_mb(server.pid)
        rows = []
        for clients in args.levels:
            rows.append(asyncio.run(level(url, questions, clients, args.seconds, args.k, args.warmup_s)))
            print(f"{clients} clients: {rows[-1]}", file=sys.stderr, flush=True)
        after = rss_mb(server.pid)
        counted, answered = counted_by_server(url)
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(60)
    where = (f"server on cores {server_cores} ({len(server_cores)} thread(s)), clients on core {client_cores}" if pinned
             else f"{len(cores)} cores shared by server and clients")
    print(f"`odqa serve` on loopback, k = {args.k}, max_batch {health['max_batch']}, max_queue {health['max_queue']}, "
          f"max_queue_s {health.get('max_queue_s')}, timeout {health['timeout_s']:g} s; {args.seconds:g} s a level; {where}")
    print("| clients | answered/s | measured | p50 ms | p99 ms | server p50 ms | server p99 ms | 429 | failed | "
          "warm-up max ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['clients']} | {r['per_s']:.2f} | {r['measured']} | {r['p50']:.0f} | {r['p99']:.0f} | "
              f"{r['server_p50']:.0f} | {r['server_p99']:.0f} | {r['shed']} | {r['failed']} | {r['warmup_max']:.0f} |")
    peak = max(rows, key=lambda r: r["per_s"])
    for kind in ("p99", "server_p99"):
        worst = max(r[kind] for r in rows if r["clients"] >= peak["clients"])
        print(f"{kind.replace('_', ' ')}: throughput peaks at {peak['clients']} clients ({peak[kind]:.0f} ms); the worst "
              f"at or beyond it is {worst / peak[kind]:.2f}x that")
    print(f"failed other than 429: {sum(r['failed'] for r in rows)} (p99: as the clients see it; server p99: from "
          f"arrival to answer inside the server, without the clients' own waiting; both over the requests started "
          f"after the first {args.warmup_s:g} s of a level)")
    for r in rows:
        if r["why"]:
            print(f"  at {r['clients']} clients: " + "; ".join(f"{n} x {w}" for w, n in r["why"].items()))
    print(f"server RSS {before:.0f} MB before, {after:.0f} MB after; exit code on SIGTERM: {code}")
    got = sum((r["statuses"] for r in rows), Counter({warm.status_code: 1}))
    lost = sum(n for r in rows for w, n in r["why"].items() if not w.startswith("HTTP"))   # no response to count
    match = counted == got and answered == got[200]
    print(f"/metrics by status {dict(sorted(counted.items()))}, latency count {answered:.0f}; the clients got "
          f"{dict(sorted(got.items()))}: {'they match' if match else 'they DIFFER'}"
          + (f" ({lost} request(s) ended without a response)" if lost else ""))
    return 0 if match or lost else 1


if __name__ == "__main__":
    sys.exit(main())
