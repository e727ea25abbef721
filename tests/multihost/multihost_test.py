"""Tensor parallelism across hosts, for real: every process in its own network namespace (a veth
into a bridge that lives in a namespace of its own: no address outside the namespaces this test
makes), started as the `multi-node` overlay starts them (`deja coordinator`, `deja worker
--rank`), with the group secret and mutual TLS on the internal plane. Each worker runs under a
restart loop, as a pod's container does.

    python3 multihost_test.py --deja BIN --source DIR [--report FILE]

Checks (each prints its figures; --report writes them as JSON):
  tp2        TP 2 across two hosts gives single-process TP 1's greedy tokens
  impaired   5 ms delay and 1% loss on a worker's link (tc netem; where the kernel has no netem,
             1% loss through iptables): the same tokens; throughput measured
  link_down  a worker's link down: the in-flight request ends UNAVAILABLE within the step and
             heartbeat timeouts, health says NOT_SERVING; the link back: the group re-forms and
             serves the same tokens (time to fail, time to recover)
  replace    a worker process killed and started again (a pod restart): the group re-forms
  stranger   a host on the bridge with the wrong group secret, or a certificate of another CA,
             does not join (the group keeps serving) and cannot call a worker
Needs root, `ip` and `tc`, and openssl; otherwise it prints why and exits 77 (skipped)."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
NET = "10.99.0"
PROMPT = "And God said, Let there be light"
TOKENS = 24
STEP_TIMEOUT_MS = 2500
HEARTBEAT_TIMEOUT_MS = 1500


def sh(cmd, check=True, **kw):
    r = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd}: rc {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


class Net:
    """Namespaces <prefix>-{sw,c,w0,w1,x}; host h gets NET.<ip[h]> on its eth0."""

    def __init__(self):
        self.prefix = f"dj{os.getpid() % 100000}"
        self.hosts = {"c": 1, "w0": 2, "w1": 3, "x": 9}
        self.made = []

    def ns(self, h):
        return f"{self.prefix}-{h}"

    def addr(self, h):
        return f"{NET}.{self.hosts[h]}"

    def up(self):
        sw = self.ns("sw")
        sh(["ip", "netns", "add", sw])
        self.made.append(sw)
        sh(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", sw, "link", "set", "br0", "up"])
        sh(["ip", "-n", sw, "link", "set", "lo", "up"])
        for h in self.hosts:
            n = self.ns(h)
            sh(["ip", "netns", "add", n])
            self.made.append(n)
            # Created inside the host's namespace, then one end moved into the switch's.
            sh(["ip", "-n", n, "link", "add", "eth0", "type", "veth", "peer", "name", f"p-{h}"])
            sh(["ip", "-n", n, "link", "set", f"p-{h}", "netns", sw])
            sh(["ip", "-n", sw, "link", "set", f"p-{h}", "master", "br0", "up"])
            sh(["ip", "-n", n, "addr", "add", f"{self.addr(h)}/24", "dev", "eth0"])
            sh(["ip", "-n", n, "link", "set", "eth0", "up"])
            sh(["ip", "-n", n, "link", "set", "lo", "up"])

    def down(self):
        for n in reversed(self.made):
            sh(["ip", "netns", "del", n], check=False)

    def link(self, h, state):
        sh(["ip", "-n", self.ns("sw"), "link", "set", f"p-{h}", state])

    def impair(self, h, on):
        """5 ms delay and 1% loss on h's link (tc netem), or, where this kernel has no netem,
        1% loss alone (iptables' statistic match). Returns what was applied."""
        n = self.ns(h)
        if not on:
            sh(["ip", "netns", "exec", n, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
            for chain in ("INPUT", "OUTPUT"):
                sh(["ip", "netns", "exec", n, "iptables", "-F", chain], check=False)
            return ""
        r = sh(["ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
                "delay", "5ms", "loss", "1%"], check=False)
        if r.returncode == 0:
            return "5 ms delay + 1% loss (netem)"
        if shutil.which("iptables") is None:
            return None
        for chain in ("INPUT", "OUTPUT"):
            sh(["ip", "netns", "exec", n, "iptables", "-A", chain, "-m", "statistic", "--mode",
                "random", "--probability", "0.01", "-j", "DROP"])
        return "1% loss each way (iptables; this kernel has no netem, so no delay)"

    def run(self, h, cmd, **kw):
        return sh(["ip", "netns", "exec", self.ns(h)] + cmd, **kw)

    def popen(self, h, cmd, log):
        return subprocess.Popen(["ip", "netns", "exec", self.ns(h)] + cmd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def make_pki(d):
    """Two CAs: the group's (a certificate for 'deja-internal', server and client use) and a
    stranger's."""
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    with open(f"{d}/ext", "w") as f:
        f.write("subjectAltName=DNS:deja-internal\nextendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("group", "stranger"):
        sh(f"openssl req -x509 {ec} -keyout {d}/{name}-ca.key -out {d}/{name}-ca.pem -days 2 "
           f"-subj /CN={name}-ca -addext basicConstraints=critical,CA:TRUE "
           f"-addext keyUsage=critical,keyCertSign")
        sh(f"openssl req {ec} -keyout {d}/{name}.key -out {d}/{name}.csr -subj /CN={name}")
        sh(f"openssl x509 -req -in {d}/{name}.csr -CA {d}/{name}-ca.pem -CAkey {d}/{name}-ca.key "
           f"-CAcreateserial -out {d}/{name}.pem -days 2 -extfile {d}/ext")
    for name, secret in (("secret", os.urandom(32).hex()), ("wrong-secret", os.urandom(32).hex())):
        with open(f"{d}/{name}", "w") as f:
            f.write(secret)
        os.chmod(f"{d}/{name}", 0o400)


class Group:
    def __init__(self, net, deja, model, d):
        self.net, self.deja, self.model, self.d = net, deja, model, d
        self.procs = []
        self.supervised = {}
        self.stop = threading.Event()

    def tls(self, who="group"):
        return ["--internal-tls-cert", f"{self.d}/{who}.pem", "--internal-tls-key",
                f"{self.d}/{who}.key", "--internal-tls-ca", f"{self.d}/group-ca.pem",
                "--internal-tls-server-name", "deja-internal"]

    def start_coordinator(self):
        c = self.net.addr("c")
        log = open(f"{self.d}/coordinator.log", "w")
        p = self.net.popen("c", [self.deja, "coordinator", "--model", self.model, "--tp", "2",
                                 "--host", c, "--port", "50051", "--metrics-port", "-1", "--http-port", "-1",
                                 "--internal-host", c, "--internal-port", "50052",
                                 "--group-secret-file", f"{self.d}/secret",
                                 "--step-timeout-ms", str(STEP_TIMEOUT_MS),
                                 "--heartbeat-timeout-ms", str(HEARTBEAT_TIMEOUT_MS)] + self.tls(),
                           log)
        self.procs.append(p)

    def worker_cmd(self, host, rank, secret="secret", cert="group", connect_ms=600000):
        a = self.net.addr(host)
        return [self.deja, "worker", "--model", self.model, "--rank", str(rank), "--world", "2",
                "--coordinator", f"{self.net.addr('c')}:50052", "--threads", "1",
                "--listen", f"{a}:50060", "--advertise", f"{a}:50060", "--gloo-host", a,
                "--group-secret-file", f"{self.d}/{secret}", "--collective-timeout-ms", "5000",
                "--connect-timeout-ms", str(connect_ms)] + self.tls(cert)

    def supervise(self, host, rank):
        """Runs the worker again whenever it exits (a pod's restart), until stopped."""
        state = {"proc": None, "starts": 0}
        self.supervised[host] = state

        def loop():
            while not self.stop.is_set():
                log = open(f"{self.d}/worker-{host}.log", "a")
                state["proc"] = self.net.popen(host, self.worker_cmd(host, rank), log)
                state["starts"] += 1
                while state["proc"].poll() is None and not self.stop.is_set():
                    time.sleep(0.1)
                if self.stop.is_set():
                    break
                time.sleep(0.5)

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return state

    def kill_worker(self, host):
        p = self.supervised[host]["proc"]
        os.killpg(p.pid, signal.SIGKILL)

    def shutdown(self):
        self.stop.set()
        for st in self.supervised.values():
            if st["proc"] is not None and st["proc"].poll() is None:
                os.killpg(st["proc"].pid, signal.SIGTERM)
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        time.sleep(1)
        for p in self.procs + [s["proc"] for s in self.supervised.values() if s["proc"]]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)

    # Client calls from the coordinator's host.
    def health(self):
        # Readiness (the service the overlay's readinessProbe asks for), not liveness.
        r = self.net.run("c", [self.deja, "client", "health", "--target",
                               f"{self.net.addr('c')}:50051", "--service",
                               "deja.v1.TextGeneration", "--timeout-ms", "2000"], check=False)
        return r.stdout.strip() or "UNREACHABLE"

    def wait_health(self, want, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.health() == want:
                return True
            time.sleep(0.2)
        return False

    def generate(self, max_new=TOKENS, prompt=PROMPT):
        r = self.net.run("c", [self.deja, "client", "generate", "--target",
                               f"{self.net.addr('c')}:50051", "--prompt", prompt,
                               "--max-new-tokens", str(max_new), "--ignore-eos", "--logprobs",
                               "--json", "--timeout-ms", "60000"], check=False)
        if r.returncode != 0:
            return None, r.stderr.strip()[-300:]
        j = json.loads(r.stdout.strip().splitlines()[-1])
        return [t.get("id", 0) for t in j.get("tokens", [])], ""


def reference_tokens(deja, model):
    r = sh([deja, "generate", "--model", model, "--prompt", PROMPT, "--max-new-tokens",
            str(TOKENS), "--ignore-eos", "--json", "--threads", "1"])
    return json.loads(r.stdout.strip().splitlines()[-1])["token_ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--report")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("skipped: needs root to make network namespaces")
        return SKIP
    for tool in ("ip", "tc", "openssl"):
        if shutil.which(tool) is None:
            print(f"skipped: no {tool}")
            return SKIP
    probe = f"djprobe{os.getpid()}"
    if sh(["ip", "netns", "add", probe], check=False).returncode != 0:
        print("skipped: this machine does not allow network namespaces")
        return SKIP
    sh(["ip", "netns", "del", probe], check=False)

    model = os.path.join(a.source, "models", "opt-mini")
    d = tempfile.mkdtemp(prefix="deja_multihost_")
    net = Net()
    group = None
    report, failures = {}, []

    def check(name, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
        if not ok:
            failures.append(f"{name}: {detail}")

    try:
        make_pki(d)
        net.up()
        want = reference_tokens(a.deja, model)
        group = Group(net, a.deja, model, d)
        group.start_coordinator()
        group.supervise("w0", 0)
        group.supervise("w1", 1)
        t0 = time.time()
        check("group forms", group.wait_health("SERVING", 120), f"{time.time() - t0:.1f} s")

        # tp2: across hosts, TP 1's tokens.
        got, err = group.generate()
        check("tp2 equals tp1", got == want, f"got {got} want {want} {err}")

        # netem on one worker's link: same tokens; throughput against the clean link.
        def throughput(n=5):
            start = time.time()
            ok = True
            for _ in range(n):
                g, _ = group.generate(max_new=32)
                ok &= g is not None
            return n * 32 / (time.time() - start), ok
        clean, ok_clean = throughput()
        applied = net.impair("w1", True)
        if applied is None:
            print("skipped netem: no netem in this kernel and no iptables", flush=True)
        else:
            got, err = group.generate()
            check("impaired link: same tokens", got == want, f"{applied}; got {got} {err}")
            lossy, ok_lossy = throughput()
            net.impair("w1", False)
            check("impaired link: throughput measured", ok_clean and ok_lossy,
                  f"{clean:.1f} tokens/s clean, {lossy:.1f} with {applied} "
                  f"({lossy / clean:.2f}x)")
            report["impaired_link"] = {"impairment": applied, "clean_tokens_per_s": clean,
                                       "impaired_tokens_per_s": lossy, "ratio": lossy / clean}

        # link_down: an in-flight stream fails within the timeouts; health NOT_SERVING; then back.
        stream = net.popen("c", [a.deja, "client", "stream", "--target", f"{net.addr('c')}:50051",
                                 "--prompt", PROMPT, "--max-new-tokens", "1000", "--ignore-eos"],
                           open(f"{d}/stream.log", "w"))
        # The link goes down once the first tokens are out: the whole stream takes about a second
        # on a fast host (opt-mini's 1,024 positions bound its length), so a fixed wait can miss it.
        deadline = time.time() + 30
        while time.time() < deadline and stream.poll() is None and \
                os.path.getsize(f"{d}/stream.log") == 0:
            time.sleep(0.01)
        t_down = time.time()
        net.link("w1", "down")
        try:
            stream.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stream.kill()
        t_fail = time.time() - t_down
        slog = open(f"{d}/stream.log").read()
        bound = (STEP_TIMEOUT_MS + HEARTBEAT_TIMEOUT_MS) / 1000 + 2
        check("in-flight request ends UNAVAILABLE", "UNAVAILABLE" in slog and t_fail <= bound,
              f"after {t_fail:.2f} s (bound {bound:.1f} s): {slog.strip()[-200:]}")
        check("health NOT_SERVING while the link is down", group.wait_health("NOT_SERVING", 10))
        time.sleep(2)
        t_up = time.time()
        net.link("w1", "up")
        back = group.wait_health("SERVING", 120)
        t_recover = time.time() - t_up
        got, err = group.generate()
        check("group re-forms after the link returns", back and got == want,
              f"SERVING after {t_recover:.1f} s; tokens {'same' if got == want else got} {err}")
        report["link_down"] = {"seconds_to_fail": t_fail, "seconds_to_recover": t_recover}

        # replace: a worker process killed and started again.
        starts = group.supervised["w0"]["starts"]
        t_kill = time.time()
        group.kill_worker("w0")
        back = False
        end = time.time() + 120
        while time.time() < end:
            if group.supervised["w0"]["starts"] > starts and group.health() == "SERVING":
                got, _ = group.generate()
                if got == want:
                    back = True
                    break
            time.sleep(0.3)
        t_replace = time.time() - t_kill
        check("group re-forms with a replaced worker", back, f"{t_replace:.1f} s")
        report["replace"] = {"seconds_to_serve_again": t_replace}

        # stranger: wrong secret, then another CA's certificate; the group keeps serving.
        for label, secret, cert in (("wrong secret", "wrong-secret", "group"),
                                    ("another CA", "secret", "stranger")):
            log = open(f"{d}/stranger-{cert}-{secret}.log", "w")
            p = net.popen("x", group.worker_cmd("x", 1, secret=secret, cert=cert, connect_ms=5000),
                          log)
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
            got, err = group.generate()
            lines = [l for l in open(log.name).read().splitlines() if l.strip()]
            why = lines[-1][-200:] if lines else ""
            check(f"stranger with {label} does not join", p.returncode not in (0, None) and
                  got == want, f"stranger rc {p.returncode} ({why}); group tokens "
                  f"{'same' if got == want else got} {err}")
        # A plaintext or uncertified call to a worker's port from the stranger's host fails.
        r = net.run("x", [a.deja, "client", "health", "--target", f"{net.addr('w0')}:50060",
                          "--timeout-ms", "3000"], check=False)
        check("a worker refuses a caller without the group's certificate", r.returncode != 0,
              (r.stdout + r.stderr).strip()[-160:])
    except Exception as e:  # setup or an unexpected error: a failure with its message
        failures.append(f"error: {e}")
        print(f"FAIL error: {e}", flush=True)
    finally:
        if group is not None:
            group.shutdown()
        net.down()
        if failures:
            for f in ("coordinator.log", "worker-w0.log", "worker-w1.log"):
                p = os.path.join(d, f)
                if os.path.exists(p):
                    print(f"==== {f} (last 30 lines)")
                    print("".join(open(p).readlines()[-30:]))
        shutil.rmtree(d, ignore_errors=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    print(f"{len(failures)} failures" if failures else "all multi-host checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
