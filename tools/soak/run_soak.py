#!/usr/bin/env python3
"""Soak: `deja serve` under `deja client soak` for a long run, watching its processes.

Starts `deja serve --tp 2` on the bundled model, runs `deja client soak` against it (N
concurrent streams with random settings, random cancels, replays compared), samples the RSS,
open file descriptors and threads of serve and every worker each few seconds from /proc, and
checks after warm-up: RSS growth below --max-rss-growth, no fd or thread growth. Prints one
JSON summary line; exits non-zero when the soak client or a check failed.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """Child processes of every thread of `pid` (the launcher forks from its own thread)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def sample(pid):
    """(rss_kib, fds, threads) of one process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds, threads
    except (OSError, AttributeError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/release/cli/deja"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/opt-mini"))
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--warmup-seconds", type=float, default=None,
                    help="default: a fifth of --seconds")
    ap.add_argument("--cancel-fraction", type=float, default=0.1)
    ap.add_argument("--max-rss-growth", type=float, default=0.05)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    args = ap.parse_args()
    warmup = args.warmup_seconds if args.warmup_seconds is not None else args.seconds / 5

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="deja_soak_", suffix=".log", delete=False)
    serve = subprocess.Popen(
        [args.binary, "serve", "--model", args.model, "--tp", "2", "--port", str(port),
         "--metrics-port", "-1", "--http-port", "-1", "--threads", str(args.threads),
         "--max-queue", str(2 * args.streams), "--max-batch-sequences", "64",
         "--kv-memory-mb", "2048", "--wait-for-kv"],
        stdout=log, stderr=subprocess.STDOUT)
    target = f"127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        ok = subprocess.run([args.binary, "client", "health", "--target", target, "--service",
                             "deja.v1.TextGeneration"], capture_output=True).returncode == 0
        if ok or serve.poll() is not None:
            break
        time.sleep(0.5)
    if serve.poll() is not None or not ok:
        print(open(log.name).read()[-3000:], file=sys.stderr)
        sys.exit("deja serve did not become ready")

    samples = []  # (t, {pid: (rss, fds, threads)})
    stop = threading.Event()

    def monitor():
        t0 = time.time()
        while not stop.is_set():
            pids = [serve.pid] + children(serve.pid)
            samples.append((time.time() - t0, {p: sample(p) for p in pids}))
            stop.wait(args.interval)

    mon = threading.Thread(target=monitor)
    mon.start()
    client = subprocess.run(
        [args.binary, "client", "soak", "--target", target, "--streams", str(args.streams),
         "--seconds", str(args.seconds), "--cancel-fraction", str(args.cancel_fraction)],
        capture_output=True, text=True)
    stop.set()
    mon.join()
    serve.send_signal(signal.SIGTERM)
    try:
        serve_exit = serve.wait(timeout=60)
    except subprocess.TimeoutExpired:
        serve.kill()
        serve_exit = "killed after 60 s"

    try:
        summary = json.loads(client.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        summary = {"client_output": client.stdout[-2000:], "client_error": client.stderr[-2000:]}

    def window(lo, hi):
        """Per pid, the max of each quantity over samples with lo <= t < hi."""
        out = {}
        for t, per in samples:
            if lo <= t < hi:
                for pid, v in per.items():
                    if v is None:
                        continue
                    cur = out.get(pid, (0, 0, 0))
                    out[pid] = tuple(max(a, b) for a, b in zip(cur, v))
        return out

    span = 30.0
    at_warm = window(warmup - span, warmup)
    at_end = window(args.seconds - span, args.seconds + 1)
    checks = {}
    failures = []
    for pid in sorted(set(at_warm) | set(at_end)):
        w, e = at_warm.get(pid), at_end.get(pid)
        if w is None or e is None:
            failures.append(f"pid {pid} not sampled in both windows (restarted?)")
            continue
        growth = (e[0] - w[0]) / w[0]
        checks[str(pid)] = {"rss_kib_warm": w[0], "rss_kib_end": e[0], "rss_growth": growth,
                            "fds_warm": w[1], "fds_end": e[1],
                            "threads_warm": w[2], "threads_end": e[2]}
        if growth >= args.max_rss_growth:
            failures.append(f"pid {pid}: RSS grew {growth:.1%}")
        if e[1] > w[1]:
            failures.append(f"pid {pid}: fds {w[1]} -> {e[1]}")
        if e[2] > w[2]:
            failures.append(f"pid {pid}: threads {w[2]} -> {e[2]}")
    if client.returncode != 0:
        failures.append("soak client: " + client.stderr.strip().splitlines()[-1]
                        if client.stderr.strip() else "soak client failed")
    if serve_exit != 0:
        failures.append(f"serve exit status {serve_exit}")
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "streams": args.streams,
                      "seconds": args.seconds, "warmup_seconds": warmup, "client": summary,
                      "processes": checks, "failures": failures, "serve_log": log.name}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
