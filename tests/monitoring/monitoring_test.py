#!/usr/bin/env python3
"""The monitoring artifacts in deploy/monitoring against real tools and a real server.

  rules      promtool check rules and promtool test rules (alerts_test.yaml: every alert firing
             and not firing) on the PrometheusRule's spec;
  dashboard  dashboard.json is a Grafana dashboard: a datasource variable of type prometheus,
             every panel typed, titled, placed on the 24-column grid and reading its queries
             from ${datasource}, unique panel ids;
  live       `deja serve` on models/opt-mini takes a few requests (one invalid); a real
             Prometheus (Debian's) scrapes it every second with the rules loaded; then every
             dashboard query, every recording rule and each side of every alert expression
             returns a series (HTTP API), every metric the dashboard names is in the scrape,
             and promtool check metrics passes on the scrape;
  logs       `deja serve --tp 2 --log-dir DIR -v 1`: one log file per process; every line of a
             worker's names its rank, every line of the coordinator's says so; a finished
             request leaves one access-log line (id, code, finish reason, prompt and generated
             tokens, TTFT, total), a refused one a `refused` line, and -v 1 its admission.

    monitoring_test.py --deja build/release/cli/deja --source . [rules|dashboard|live|logs ...]
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import FAILURES, check, run_parts  # noqa: E402


def need(tool):
    path = shutil.which(tool)
    if path is None:
        sys.exit(f"{tool} is not installed (Debian package prometheus; scripts/install_deps.sh "
                 "installs it)")
    return path


def write_rules(source, out_dir, group_interval=None):
    doc = yaml.safe_load(open(os.path.join(source, "deploy/monitoring/prometheus-rule.yaml")))
    spec = doc["spec"]
    if group_interval:
        for g in spec["groups"]:
            g["interval"] = group_interval
    path = os.path.join(out_dir, "deja-rules.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    return path, spec


def test_rules(source):
    promtool = need("promtool")
    with tempfile.TemporaryDirectory() as d:
        write_rules(source, d)
        shutil.copy(os.path.join(source, "deploy/monitoring/alerts_test.yaml"), d)
        for args in (["check", "rules", "deja-rules.yaml"], ["test", "rules", "alerts_test.yaml"]):
            r = subprocess.run([promtool] + args, cwd=d, capture_output=True, text=True)
            print(r.stdout + r.stderr)
            check(r.returncode == 0, "promtool " + " ".join(args))


def dashboard_queries(dash):
    for p in dash["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def test_dashboard(source):
    dash = json.load(open(os.path.join(source, "deploy/monitoring/dashboard.json")))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables.get("datasource", {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
          "a datasource variable of type prometheus")
    check(isinstance(dash.get("schemaVersion"), int) and dash.get("title") and dash.get("uid"),
          "title, uid and schemaVersion")
    ids = [p.get("id") for p in dash["panels"]]
    check(len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids), "unique panel ids")
    for p in dash["panels"]:
        g = p.get("gridPos", {})
        placed = all(isinstance(g.get(k), int) for k in "xywh") and g["x"] + g["w"] <= 24
        check(p.get("type") and p.get("title") and placed, f"panel '{p.get('title')}' typed and placed")
        if p["type"] == "row":
            continue
        uids = [p["datasource"]["uid"]] + [t["datasource"]["uid"] for t in p["targets"]]
        check(all(u == "${datasource}" for u in uids) and p["targets"],
              f"panel '{p['title']}' queries ${{datasource}}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(prom, expr):
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    j = json.loads(http_get(url))
    if j.get("status") != "success":
        raise RuntimeError(f"{expr}: {j}")
    return j["data"]["result"]


def alert_sides(expr):
    """The operands of an alert expression: split at `and`/`unless`, comparisons dropped."""
    parts = re.split(r"\s+(?:and|unless|or)(?:\s+on\s*\([^)]*\))?\s+", " ".join(expr.split()))
    return [re.sub(r"\s*(==|!=|>=|<=|>|<)\s*[-+0-9.e]+\s*$", "", p) for p in parts]


def test_live(source, deja):
    prometheus, promtool = need("prometheus"), need("promtool")
    procs = []
    with tempfile.TemporaryDirectory() as d:
        try:
            metrics_port = free_port()
            serve_log = open(os.path.join(d, "serve.log"), "w+")
            procs.append(subprocess.Popen(
                [deja, "serve", "--model", os.path.join(source, "models/opt-mini"), "--port", "0",
                 "--metrics-port", str(metrics_port), "--http-port", "-1"], stdout=serve_log, stderr=subprocess.STDOUT))
            target = None
            for _ in range(240):
                serve_log.seek(0)
                m = re.search(r"serving on (\S+:\d+)", serve_log.read())
                if m and subprocess.run([deja, "client", "health", "--target", m.group(1)],
                                        capture_output=True).returncode == 0:
                    target = m.group(1)
                    break
                time.sleep(0.5)
            check(target is not None, "deja serve became healthy")
            if target is None:
                serve_log.seek(0)
                print(serve_log.read()[-3000:])
                return
            for prompt in ["The quick brown fox", "Once upon a time", "In the beginning"]:
                r = subprocess.run([deja, "client", "generate", "--target", target, "--prompt",
                                    prompt, "--max-new-tokens", "8"], capture_output=True, text=True)
                check(r.returncode == 0, f"request '{prompt}'")
            subprocess.run([deja, "client", "generate", "--target", target, "--prompt", "",
                            "--max-new-tokens", "8"], capture_output=True)

            scrape = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
            r = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True,
                               text=True)
            print(r.stdout + r.stderr)
            check(r.returncode == 0, "promtool check metrics on a live scrape")
            exported = set(re.findall(r"^# TYPE (\S+) ", scrape, re.M))

            _, spec = write_rules(source, d, group_interval="1s")
            prom_port = free_port()
            prom = f"127.0.0.1:{prom_port}"
            with open(os.path.join(d, "prometheus.yml"), "w") as f:
                yaml.safe_dump({
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [os.path.join(d, "deja-rules.yaml")],
                    "scrape_configs": [{"job_name": "deja", "static_configs": [
                        {"targets": [f"127.0.0.1:{metrics_port}"]}]}],
                }, f)
            procs.append(subprocess.Popen(
                [prometheus, f"--config.file={d}/prometheus.yml", f"--storage.tsdb.path={d}/tsdb",
                 f"--web.listen-address={prom}"], stdout=open(os.path.join(d, "prom.log"), "w"),
                stderr=subprocess.STDOUT))
            up = False
            for _ in range(120):
                try:
                    up = any(s["value"][1] == "1" for s in query(prom, 'up{job="deja"}'))
                except OSError:
                    pass
                if up:
                    break
                time.sleep(0.5)
            check(up, "Prometheus scrapes deja")
            if not up:
                print(open(os.path.join(d, "prom.log")).read()[-3000:])
                return
            time.sleep(8)  # several scrapes and rule evaluations, so rate() has two samples

            dash = json.load(open(os.path.join(source, "deploy/monitoring/dashboard.json")))
            for title, expr in dashboard_queries(dash):
                e = expr.replace("$job", ".+").replace("$__rate_interval", "30s")
                res = query(prom, e)
                check(len(res) > 0, f"dashboard '{title}': {e}")
                for name in re.findall(r"\b(deja_[a-z_]+)", e):
                    base = re.sub(r"_(bucket|sum|count)$", "", name)
                    check(name in exported or base in exported, f"metric {name} is exported")
            for group in spec["groups"]:
                for rule in group["rules"]:
                    if "record" in rule:
                        check(len(query(prom, rule["record"])) > 0, f"recording rule {rule['record']}")
                    else:
                        for side in alert_sides(rule["expr"]):
                            check(len(query(prom, side)) > 0, f"alert {rule['alert']}: {side}")
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


def start_serve(deja, args, log_path):
    """`deja serve ... --port 0` with its output in log_path; (process, target or None)."""
    out = open(log_path, "w+")
    proc = subprocess.Popen([deja, "serve"] + args + ["--port", "0"], stdout=out,
                            stderr=subprocess.STDOUT)
    for _ in range(240):
        out.seek(0)
        m = re.search(r"serving on (\S+:\d+)", out.read())
        if m and subprocess.run([deja, "client", "health", "--target", m.group(1), "--service",
                                 "deja.v1.TextGeneration"], capture_output=True).returncode == 0:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    return proc, None


def test_logs(source, deja):
    with tempfile.TemporaryDirectory() as d:
        logs = os.path.join(d, "logs")
        os.mkdir(logs)
        proc, target = start_serve(deja, ["--model", os.path.join(source, "models/opt-mini"),
                                          "--tp", "2", "--metrics-port", "-1", "--http-port", "-1", "--log-dir", logs,
                                          "-v", "1"], os.path.join(d, "serve.out"))
        try:
            check(target is not None, "deja serve --tp 2 --log-dir -v 1 became ready")
            if target is None:
                return
            r = subprocess.run([deja, "client", "generate", "--target", target, "--prompt", "Hello",
                                "--max-new-tokens", "4", "--request-id", "access-ok-1"],
                               capture_output=True, text=True)
            check(r.returncode == 0, "a request with id access-ok-1")
            subprocess.run([deja, "client", "generate", "--target", target, "--prompt", "",
                            "--request-id", "access-bad-1"], capture_output=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        files = [os.path.join(logs, f) for f in os.listdir(logs) if ".log.INFO." in f]
        check(len(files) == 3, f"one INFO log file per process (coordinator and 2 workers): {len(files)}")
        line = re.compile(r"^[IWEF]\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+ (.*?)\] ")
        roles = set()
        everything = ""
        for f in files:
            text = open(f).read()
            everything += text
            entries = [l for l in text.splitlines() if re.match(r"^[IWEF]\d{8} ", l)]
            parts = {m.group(1) if (m := line.match(l)) else None for l in entries}
            check(len(parts) == 1 and None not in parts and entries,
                  f"{os.path.basename(f)}: every line names one part: {sorted(map(str, parts))}")
            roles |= parts
        check(roles == {"coordinator", "rank 0/2", "rank 1/2"},
              f"the parts are the coordinator and ranks 0/2 and 1/2: {sorted(map(str, roles))}")
        check(re.search(r"coordinator\] request access-ok-1: finished code=OK finish_reason=length "
                        r"prompt_tokens=\d+ generated_tokens=4 ttft_ms=[\d.]+ total_ms=[\d.]+$",
                        everything, re.M) is not None, "the access-log line of access-ok-1")
        check(re.search(r"request access-bad-1: refused code=INVALID_ARGUMENT reason=invalid_argument",
                        everything) is not None, "the refusal line of access-bad-1")
        check("request access-ok-1: admitted as seq" in everything, "-v 1 shows the admission")
        check(re.search(r"rank 1/2\] .*loaded .* MiB", everything) is not None,
              "a worker logs its model load with the bytes")


if __name__ == "__main__":
    run_parts({"rules": lambda source, deja: test_rules(source),
               "dashboard": lambda source, deja: test_dashboard(source),
               "live": test_live, "logs": test_logs})
