"""The server's limits hold against a real uvicorn on 127.0.0.1, with `odqa serve`'s protocol and app:
the body limit counts the bytes received whatever the headers say, a client that sends its request
too slowly (one header byte a second, half a body) is closed within the request timeout while others
are served, and a request whose client has gone is never computed."""
import asyncio
import json
import socket
import threading
import time

import httpx
import psutil
import pytest
import uvicorn

from odqa.system.serve import (
    MAX_BODY_BYTES,
    REQUEST_TIMEOUT_ENV,
    AnswerRequest,
    Batcher,
    Metrics,
    TimedH11Protocol,
    create_app,
)

TIMEOUT_S = 1.5


class GatedPipeline:
    """Answers once `go` is set (at once when it is), and records the questions it computed."""

    def __init__(self):
        self.asked, self.go = [], threading.Event()
        self.go.set()

    def answer(self, questions, k=10, **settings):
        self.go.wait(30)
        self.asked += questions
        if "fail" in questions[0]:
            raise RuntimeError("a pipeline that fails")
        # "malformed": an answer the response model refuses, which starlette answers 500 outside the app
        return [{"question": q, "extractive": None, "generated": 5 if "malformed" in q else "x", "passages": [],
                 "timings": {"retrieve_ms": 1.0, "read_ms": 2.0}} for q in questions]


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv(REQUEST_TIMEOUT_ENV, str(TIMEOUT_S))
    pipeline = GatedPipeline()
    app = create_app(pipeline, max_batch=1, max_wait_ms=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=TimedH11Protocol, log_level="warning", lifespan="on")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.02)
    yield {"url": f"http://127.0.0.1:{port}", "port": port, "pipeline": pipeline, "app": app}
    pipeline.go.set()
    srv.should_exit = True
    thread.join(10)


def raw(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def closed_within(sock, seconds) -> float | None:
    """Seconds until the server closes `sock` (reads until EOF), or None if it is still open after `seconds`."""
    start = time.perf_counter()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except (socket.timeout, TimeoutError):
        return None
    except ConnectionResetError:
        pass
    return time.perf_counter() - start


def gone_count(url) -> float:
    text = httpx.get(f"{url}/metrics").text
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("odqa_requests_gone_total"))


def test_a_chunked_body_past_the_limit_is_413_whatever_content_length_says(server):
    rss = psutil.Process().memory_info().rss
    sock = raw(server["port"])
    head = (b"POST /answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    sock.sendall(head)
    chunk = b"a" * 65536
    sent = 0
    try:
        while sent < 20 * 2**20:     # 20 MB, chunk by chunk; the server stops reading at the limit
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    reply = b""
    try:
        while b"\r\n\r\n" not in reply:
            part = sock.recv(65536)
            if not part:
                break
            reply += part
    except ConnectionResetError:
        pass
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert psutil.Process().memory_info().rss - rss < 64 * 2**20
    # a body within the limit is still answered, chunked or not
    r = httpx.post(f"{server['url']}/answer", content=json.dumps({"question": "who"}).encode(),
                   headers={"content-type": "application/json", "transfer-encoding": "chunked"})
    assert r.status_code == 200
    r = httpx.post(f"{server['url']}/answer", json={"question": "q" * 10, "k": 3, "pad": "x" * MAX_BODY_BYTES})
    assert r.status_code == 413


def test_slow_clients_are_closed_within_the_timeout_while_others_are_served(server):
    slow_header = raw(server["port"])
    half_body = raw(server["port"])
    half_body.sendall(b"POST /answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                      b'{"question": ')
    silent = raw(server["port"])
    stop = threading.Event()

    def drip():
        for byte in b"POST /answer HTTP/1.1\r\nHost: x\r\n":
            if stop.wait(0.5):
                return
            try:
                slow_header.sendall(bytes([byte]))
            except OSError:
                return
    threading.Thread(target=drip, daemon=True).start()
    served = httpx.post(f"{server['url']}/answer", json={"question": "meanwhile"})
    assert served.status_code == 200 and served.json()["generated"] == "x"
    for sock in (slow_header, half_body, silent):
        took = closed_within(sock, TIMEOUT_S + 3)
        assert took is not None and took < TIMEOUT_S + 1.0
        sock.close()
    stop.set()


def test_a_request_whose_client_has_gone_is_not_computed(server):
    pipeline = server["pipeline"]
    pipeline.go.clear()          # the worker is busy: requests wait for their batch
    busy = threading.Thread(target=lambda: httpx.post(f"{server['url']}/answer", json={"question": "first"}, timeout=30))
    busy.start()
    for _ in range(100):
        if server["app"].state.batcher.in_flight:
            break
        time.sleep(0.02)
    body = json.dumps({"question": "abandoned"}).encode()
    sock = raw(server["port"])
    sock.sendall(b"POST /answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    time.sleep(0.3)              # queued behind "first"
    sock.close()                 # and the client goes
    time.sleep(0.3)
    pipeline.go.set()
    busy.join(30)
    r = httpx.post(f"{server['url']}/answer", json={"question": "after"})
    assert r.status_code == 200
    assert pipeline.asked == ["first", "after"]
    assert gone_count(server["url"]) == 1


def test_metrics_count_every_response_the_clients_got_by_status(server):
    """Answers, refusals (422, 405), a pipeline's failure and an answer the response model refuses
    (both 500: the second was once answered outside the count): /metrics's counts by status are the
    clients', and the latency histogram counts the 200s."""
    from collections import Counter

    from prometheus_client.parser import text_string_to_metric_families
    got, url = Counter(), server["url"]
    # a connection each: uvicorn closes one after an error the app did not handle
    for body in ([{"question": f"q{i}"} for i in range(5)] + [{"question": ""}, {"question": "x", "k": 0},
                 {"question": "fail me"}, {"question": "malformed"}, {"question": "malformed again"}]):
        got[httpx.post(f"{url}/answer", json=body, timeout=30).status_code] += 1
    got[httpx.get(f"{url}/answer").status_code] += 1
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    counted = {int(s.labels["status"]): s.value for s in families["odqa_requests"].samples if s.name.endswith("_total")}
    assert got == Counter({200: 5, 422: 2, 500: 3, 405: 1}) and counted == dict(got)
    answered = [s.value for s in families["odqa_request_seconds"].samples if s.name.endswith("_count")]
    assert answered == [5]


class EndlessPipeline:
    """Computes until its deadline stops it, as the reader's stages and decoding steps do; records how
    long it ran past the request's timeout."""

    def __init__(self):
        self.ran_s, self.stopped = [], threading.Event()

    def answer(self, questions, k=10, **settings):
        from odqa.common.timings import check_deadline
        if questions[0] == "quick":
            return GatedPipeline().answer(questions, k)
        start = time.perf_counter()
        try:
            while time.perf_counter() - start < 30:
                check_deadline("the next step")
                time.sleep(0.01)
        finally:
            self.ran_s.append(time.perf_counter() - start)
            self.stopped.set()
        return GatedPipeline().answer(questions, k)


def test_a_request_past_its_timeout_stops_its_work_and_the_next_is_served():
    async def scenario():
        batcher = Batcher(Metrics(), max_batch=1, max_wait_ms=1, timeout_s=0.5)
        batcher.pipeline = EndlessPipeline()
        worker = asyncio.ensure_future(batcher.run())
        try:
            with pytest.raises(asyncio.TimeoutError):
                await batcher.submit(AnswerRequest(question="endless"))
            start = time.perf_counter()
            answer = await batcher.submit(AnswerRequest(question="quick"))
            return answer, time.perf_counter() - start, batcher
        finally:
            worker.cancel()
    answer, waited, batcher = asyncio.run(scenario())
    assert answer["generated"] == "x" and waited < 2      # not behind 30 s of work no one reads
    assert batcher.pipeline.ran_s and batcher.pipeline.ran_s[0] < 1.5
