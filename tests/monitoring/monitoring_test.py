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
             and promtool check metrics passes on the scrape.

    monitoring_test.py --deja build/release/cli/deja --source . [rules|dashboard|live ...]
"""
import argparse
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

FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


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
                 "--metrics-port", str(metrics_port)], stdout=serve_log, stderr=subprocess.STDOUT))
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("parts", nargs="*", default=["rules", "dashboard", "live"])
    a = ap.parse_args()
    for part in a.parts:
        print(f"== {part}", flush=True)
        {"rules": lambda: test_rules(a.source), "dashboard": lambda: test_dashboard(a.source),
         "live": lambda: test_live(a.source, a.deja)}[part]()
    if FAILURES:
        print(f"{len(FAILURES)} checks failed:\n  " + "\n  ".join(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
