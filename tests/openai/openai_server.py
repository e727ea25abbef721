"""For tests/openai: a real `deja serve` (TP 2, models/opt-mini) on free ports with its three
APIs (gRPC, OpenAI HTTP, /metrics), scrapes of its metrics, and a throwaway PKI.
"""
import os
import re
import subprocess
import tempfile
import time
import urllib.request

SERVING_RE = re.compile(
    r"deja: serving on ([^:\s]+):(\d+) \(metrics on port (-?\d+), OpenAI API on port (-?\d+)\)")
PROMPT = "And God said, Let there be light"


class Server:
    """`deja serve` with `extra` flags, waited for until it is ready."""

    def __init__(self, deja, source, extra=(), name="serve"):
        self.log = tempfile.NamedTemporaryFile(prefix=f"deja_openai_{name}_", suffix=".log",
                                               delete=False)
        args = [deja, "serve", "--model", os.path.join(source, "models/opt-mini"), "--tp", "2",
                "--port", "0", "--metrics-port", "0", "--http-port", "0", "--threads", "1",
                "--dtype", "checkpoint", "--kv-dtype", "f32"] + list(extra)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = open(self.log.name, errors="replace").read()
            m = SERVING_RE.search(text)
            if m and "deja: ready" in text:
                self.grpc_port, self.metrics_port, self.http_port = (
                    int(m.group(2)), int(m.group(3)), int(m.group(4)))
                self.base = f"http://127.0.0.1:{self.http_port}"
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        print(open(self.log.name, errors="replace").read()[-3000:])
        raise RuntimeError("deja serve did not become ready")

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            return r.read().decode()

    def series(self, name, labels=""):
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if all(f'{l}' in line for l in labels.split(",") if l):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def make_pki(d):
    """A CA and a server certificate for 127.0.0.1 in directory d, with the `openssl` CLI."""
    sh = ("set -e\n"
          "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key "
          "-out ca.pem -days 2 -subj /CN=ca\n"
          "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key "
          "-out server.csr -subj /CN=server\n"
          "echo subjectAltName=IP:127.0.0.1 > server.ext\n"
          "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
          "-out server.pem -days 2 -extfile server.ext\n")
    subprocess.run(["sh", "-c", sh], cwd=d, check=True, capture_output=True)


