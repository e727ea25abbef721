"""Locust users for bench/openai_load.sh: each streams POST /v1/completions again and again
(greedy, EOS ignored, DEJA_LOAD_MAX_TOKENS tokens) and times the stream as it arrives: time to
the first piece of text, the gaps between pieces (inter-token latency), and the usage chunk's
token count. A stream that does not end with `data: [DONE]`, or any status but 200, is a
failure. At the end it prints one JSON line of percentiles (`load_summary`).
"""
import json
import os
import threading
import time

from locust import HttpUser, events, task

MAX_TOKENS = int(os.environ.get("DEJA_LOAD_MAX_TOKENS", "64"))
PROMPT = os.environ.get("DEJA_LOAD_PROMPT", "And God said, Let there be light")

_lock = threading.Lock()
_ttft, _gaps = [], []
_tokens = 0
_streams = 0
_failures = 0
_start = time.monotonic()


class Streamer(HttpUser):
    @task
    def stream(self):
        global _tokens, _streams, _failures
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        t0 = time.monotonic()
        last, ttft, gaps, tokens, done = None, None, [], 0, False
        with self.client.post("/v1/completions", json=body, stream=True, catch_response=True,
                              name="/v1/completions (stream)") as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}")
            else:
                buf = b""
                for chunk in r.iter_content(chunk_size=None):
                    buf += chunk if isinstance(chunk, bytes) else chunk.encode()
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        if not event.startswith(b"data: "):
                            continue
                        data = event[6:]
                        if data == b"[DONE]":
                            done = True
                            continue
                        j = json.loads(data)
                        if j.get("usage"):
                            tokens = j["usage"]["completion_tokens"]
                        if j.get("choices") and j["choices"][0].get("text"):
                            now = time.monotonic()
                            if last is None:
                                ttft = now - t0
                            else:
                                gaps.append(now - last)
                            last = now
                if done and tokens == MAX_TOKENS:
                    r.success()
                else:
                    r.failure(f"stream ended early (done={done}, tokens={tokens})")
        with _lock:
            if done and tokens == MAX_TOKENS:
                _streams += 1
                _tokens += tokens
                if ttft is not None:
                    _ttft.append(ttft)
                _gaps.extend(gaps)
            else:
                _failures += 1


def _pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    return 1e3 * v[min(len(v) - 1, int(p * len(v)))]


@events.test_start.add_listener
def _started(**_):
    global _start
    _start = time.monotonic()


@events.test_stop.add_listener
def _summary(environment, **_):
    seconds = time.monotonic() - _start
    users = getattr(environment.parsed_options, "num_users", None)
    print("load_summary " + json.dumps({
        "users": users, "seconds": round(seconds, 1), "streams": _streams,
        "failures": environment.stats.total.num_failures, "failed_streams": _failures,
        "tokens_per_second": _tokens / max(seconds, 1e-9),
        "ttft_ms_p50": _pct(_ttft, 0.5), "ttft_ms_p90": _pct(_ttft, 0.9),
        "ttft_ms_p99": _pct(_ttft, 0.99),
        "inter_token_ms_p50": _pct(_gaps, 0.5), "inter_token_ms_p90": _pct(_gaps, 0.9),
        "inter_token_ms_p99": _pct(_gaps, 0.99)}), flush=True)
