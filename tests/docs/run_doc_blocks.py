#!/usr/bin/env python3
"""Runs the shell blocks of the user docs, so that a doc that no longer works fails CI.

The docs: README.md, docs/*.md (not docs/studies/), examples/README.md, predictors/README.md.
Every ```sh, ```bash, ```shell or ```console block in them needs a marker on the line before
its fence (blank lines between are allowed) saying what to do with it:

  <!-- doc-test: run -->            run it; it needs no server
  <!-- doc-test: starts-server -->  its last command starts a server in the foreground
                                    (`deja serve ...`); it runs in the background until the
                                    server prints `deja: ready`, and serves the `server` blocks
                                    after it in the same file (until the next such block)
  <!-- doc-test: server -->         it talks to a running server: the one the file started
                                    last, else one the script starts, as
                                    `deja serve --model models/opt-mini --tp 2 --predictors
                                    models/opt-mini/predictors.safetensors`
  <!-- doc-test: skip (REASON) -->  not run; the reason is printed

`run`, `starts-server` and `server` may add `; replace OLD with NEW` (repeatable): each OLD
in the block becomes NEW, e.g. a virtual environment's python as the python3 that runs the
tests. A shell block without a marker, with an unknown one, a skip without a reason, or a
non-skipped block that installs packages, builds, uses sudo, containers, Kubernetes or a GPU,
fails. (Untagged fences, diagrams and logs, are not looked at.)

What the script substitutes, in every block it runs:
  - the working directory is a copy of the source tree in a temporary directory (without .git
    and build outputs), whose build/release is the build directory: nothing is written into the
    source tree or the build directory;
  - PATH starts with the build's cli/ and lab/ (the docs' bare `deja` and `deja-lab`), HOME is
    a temporary directory,
    DEJA_LOG_LEVEL is 1 (no INFO lines) unless it is set;
  - for the blocks of a server: its port for 50051, its metrics port for 9090 and its OpenAI
    API port for 8000 (each server gets free ports); `--port`/`--metrics-port`/`--http-port`
    added to a `deja serve` that names none, and
    `--target` to a `deja client` or `examples/python_client.py` that names none; `--host
    0.0.0.0` becomes `--host 127.0.0.1` (nothing is served to other hosts).
Each block runs as `bash -e -o pipefail` with a time limit. examples/README.md runs first: it
generates the Python modules that the other docs' python_client.py lines need.

Exit status: 0 when every block that runs passes and every block has a verdict, else 1.

  run_doc_blocks.py --build-dir build/release --source-dir . [--only FILE ...] [--timeout S]
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

DOCS_FIRST = ["examples/README.md"]  # generates examples/gen for the others
SHELL_LANGS = {"sh", "bash", "shell", "console"}
MARKER_RE = re.compile(r"^\s*<!--\s*doc-test:(.*?)-->\s*$")
FENCE_RE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([A-Za-z0-9_+-]*)")
SHARED_SERVER = ("deja serve --model models/opt-mini --tp 2 "
                 "--predictors models/opt-mini/predictors.safetensors")
# A block that is run must not do any of these: they install, build, need privileges, a cluster,
# containers or a GPU. Such a block is marked skip, with its reason.
NOT_IN_CI = [
    (r"\bsudo\b", "sudo"),
    (r"\bapt(-get)?\s+install\b", "installs packages"),
    (r"\bpip3?\s+install\b", "installs packages"),
    (r"\bkubectl\b|\bhelm\b", "Kubernetes"),
    (r"\bdocker\b|\bpodman\b", "containers"),
    (r"scripts/(run|test|build|fuzz|soak|install_deps|gpu_bundle|gpu_bundle_bare|gpu_check)\.sh",
     "a project script that builds or runs for long"),
    (r"\bcmake\b|\bninja\b|\bctest\b", "builds or runs the test suite"),
    (r"--device\s+cuda|\bnvidia-smi\b|gpu_check\.sh", "a GPU"),
]
READY = "deja: ready"
SERVING_RE = re.compile(
    r"deja: serving on ([^:\s]+):(\d+) \(metrics on port (-?\d+), OpenAI API on port (-?\d+)\)")


class Block:
    def __init__(self, path, line, lang, text, marker, marker_line):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.marker, self.marker_line = marker, marker_line
        self.kind, self.reason, self.replacements, self.error = None, "", [], None

    @property
    def where(self):
        return f"{self.path}:{self.line}"


def doc_files(source):
    files = ["README.md"]
    files += sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(source, "docs"))
                    if f.endswith(".md"))
    files += ["examples/README.md", "predictors/README.md"]
    files = [f for f in files if os.path.isfile(os.path.join(source, f))]
    return sorted(files, key=lambda f: (f not in DOCS_FIRST, files.index(f)))


def extract(source, rel):
    """The shell blocks of one file, each with the marker before it (or None)."""
    lines = open(os.path.join(source, rel), encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
            j += 1
        if lang in SHELL_LANGS:
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            marker = None
            mm = MARKER_RE.match(lines[k]) if k >= 0 else None
            if mm:
                marker = mm.group(1).strip()
            blocks.append(Block(rel, i + 1, lang, "\n".join(lines[i + 1:j]), marker,
                                k + 1 if mm else None))
        i = j + 1
    return blocks


def classify(block):
    if block.marker is None:
        block.error = ("no verdict: put <!-- doc-test: run|server|starts-server|skip (REASON) --> "
                       "on the line before the fence")
        return
    m = re.match(r"^skip\s*\((.*\S.*)\)$", block.marker)
    if m:
        block.kind, block.reason = "skip", m.group(1).strip()
        return
    if block.marker.startswith("skip"):
        block.error = "skip needs a reason: <!-- doc-test: skip (REASON) -->"
        return
    parts = [p.strip() for p in block.marker.split(";")]
    head = parts[0]
    if head not in ("run", "server", "starts-server"):
        block.error = f"unknown doc-test marker '{head}'"
        return
    block.kind = head
    for p in parts[1:]:
        r = re.match(r"^replace\s+(\S+)\s+with\s+(\S+)$", p)
        if not r:
            block.error = f"cannot read '{p}' (expected: replace OLD with NEW)"
            return
        block.replacements.append((r.group(1), r.group(2)))
    commands = without_comments(commands_of(block))
    for pattern, what in NOT_IN_CI:
        if re.search(pattern, commands):
            block.error = f"this block cannot run in CI ({what}): mark it skip with the reason"
            return
    serves = [ln for ln in logical_lines(commands) if re.search(r"\bdeja serve\b", ln)]
    if block.kind == "starts-server":
        if len(serves) != 1:
            block.error = "a starts-server block starts exactly one `deja serve`"
    elif any(not ln.rstrip().endswith("&") for ln in serves):
        block.error = "starts a server in the foreground: mark it starts-server"


def commands_of(block):
    """The block as a script: a console block keeps only its `$ ` commands."""
    if block.lang != "console":
        return block.text
    out = []
    for ln in block.text.split("\n"):
        if ln.startswith("$ "):
            out.append(ln[2:])
        elif out and out[-1].endswith("\\"):
            out.append(ln)
    return "\n".join(out)


def without_comments(text):
    """The text without comment lines and trailing ` # ...` comments (for the checks only)."""
    out = []
    for ln in text.split("\n"):
        if ln.lstrip().startswith("#"):
            continue
        out.append(re.sub(r"\s+#\s.*$", "", ln))
    return "\n".join(out)


def logical_lines(text):
    out, cur = [], ""
    for ln in text.split("\n"):
        cur += ln + "\n"
        if not ln.endswith("\\"):
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def substitute(block, server):
    """The script to run: the block with the marker's replacements and the server's ports."""
    text = commands_of(block)
    for old, new in block.replacements:
        if old not in text:
            raise ValueError(f"replace: '{old}' is not in the block")
        text = text.replace(old, new)
    if server is None:
        return text
    port, mport, hport = server["port"], server["metrics_port"], server["http_port"]
    text = re.sub(r"(?<!\d)50051(?!\d)", str(port), text)
    text = re.sub(r"(?<!\d)9090(?!\d)", str(mport), text)
    text = re.sub(r"(?<!\d)8000(?!\d)", str(hport), text)
    text = re.sub(r"--host(\s+|=)0\.0\.0\.0\b", r"--host\g<1>127.0.0.1", text)
    out = []
    for ln in logical_lines(text):
        if ln.lstrip().startswith("#"):
            out.append(ln)
            continue
        if re.search(r"\bdeja serve\b", ln):
            extra = ""
            if "--port" not in ln:
                extra += f" --port {port}"
            if "--metrics-port" not in ln:
                extra += f" --metrics-port {mport}"
            if "--http-port" not in ln:
                extra += f" --http-port {hport}"
            ln = re.sub(r"\bdeja serve\b", lambda m: m.group(0) + extra, ln, count=1)
        if re.search(r"\bdeja client\s+\w+", ln) and "--target" not in ln:
            target = f" --target 127.0.0.1:{port}"
            ln = re.sub(r"\bdeja client\s+\w+", lambda m: m.group(0) + target, ln, count=1)
        if "examples/python_client.py" in ln and "--target" not in ln:
            ln = ln.replace("examples/python_client.py",
                            f"examples/python_client.py --target localhost:{port}", 1)
        out.append(ln)
    return "".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(text, n=40):
    lines = text.rstrip("\n").split("\n")
    return "\n".join(("    " + ln) for ln in lines[-n:])


class Runner:
    def __init__(self, args):
        self.args = args
        self.source = os.path.abspath(args.source_dir)
        self.build = os.path.abspath(args.build_dir)
        self.deja = os.path.join(self.build, "cli", "deja")
        self.tmp = tempfile.mkdtemp(prefix="deja-doc-test-")
        self.work = os.path.join(self.tmp, "src")
        self.home = os.path.join(self.tmp, "home")
        self.logs = os.path.join(self.tmp, "logs")
        self.server = None  # the running server: dict(proc, port, metrics_port, log, owner)
        self.block_proc = None  # the block running now
        self.results = []   # (verdict, block, detail)

    # The working copy -------------------------------------------------------------------------
    def prepare(self):
        os.makedirs(self.home)
        os.makedirs(self.logs)
        build_in_source = os.path.relpath(self.build, self.source)
        skip_top = {".git", "build", "gpu-bundle", "gpu-bundle.tar.xz"}
        if not build_in_source.startswith(".."):
            skip_top.add(build_in_source.split(os.sep)[0])

        def ignore(directory, names):
            drop = {"__pycache__"}
            if os.path.samefile(directory, self.source):
                drop |= skip_top
            if os.path.samefile(directory, os.path.join(self.source, "examples")):
                drop.add("gen")
            return [n for n in names if n in drop]

        shutil.copytree(self.source, self.work, ignore=ignore, symlinks=True)
        os.makedirs(os.path.join(self.work, "build"))
        os.symlink(self.build, os.path.join(self.work, "build", "release"))
        self.env = dict(os.environ)
        self.env["PATH"] = (os.path.join(self.build, "cli") + os.pathsep +
                            os.path.join(self.build, "lab") + os.pathsep + self.env.get("PATH", ""))
        self.env["HOME"] = self.home
        self.env.pop("DEJA_AUTH_TOKEN", None)
        self.env.pop("DEJA_GROUP_SECRET", None)
        self.env["DEJA_LOG_LEVEL"] = self.env.get("DEJA_LOG_LEVEL", "1")

    # Servers ----------------------------------------------------------------------------------
    def start_server(self, script, port, mport, hport, owner):
        """Runs `script` in the background until a server in it is ready; None if it is not."""
        self.stop_server()
        log = os.path.join(self.logs, f"server-{len(self.results)}.log")
        path = os.path.join(self.logs, f"server-{len(self.results)}.sh")
        with open(path, "w") as f:
            f.write(script + "\n")
        out = open(log, "w")
        proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", path], cwd=self.work,
                                env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self.server = dict(proc=proc, port=port, metrics_port=mport, http_port=hport, log=log,
                           owner=owner)
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline:
            text = open(log, errors="replace").read()
            if READY in text:
                m = SERVING_RE.search(text)
                if m and int(m.group(2)) != port:
                    return f"the server is on port {m.group(2)}, not the {port} it was given"
                return None
            if proc.poll() is not None:
                return f"exited with status {proc.returncode} before it was ready"
            time.sleep(0.1)
        return f"not ready within {self.args.timeout:g} s"

    def server_log(self):
        return open(self.server["log"], errors="replace").read() if self.server else ""

    def stop_server(self):
        if self.server is None:
            return
        proc = self.server["proc"]
        self.server = None
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # bash, deja serve and its workers
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        # Leftovers of the group (workers stopping after the coordinator) go too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def ensure_shared_server(self):
        if self.server is not None and self.server["owner"] == "shared":
            return None
        port, mport, hport = free_port(), free_port(), free_port()
        return self.start_server(
            f"{SHARED_SERVER} --port {port} --metrics-port {mport} --http-port {hport}",
            port, mport, hport, "shared")

    # Blocks -----------------------------------------------------------------------------------
    def run_script(self, script):
        path = os.path.join(self.logs, f"block-{len(self.results)}.sh")
        with open(path, "w") as f:
            f.write(script + "\n")
        proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", path], cwd=self.work,
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, text=True,
                                errors="replace")
        self.block_proc = proc
        try:
            out, _ = proc.communicate(timeout=self.args.timeout)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return None, out
        finally:
            self.block_proc = None

    def stop_all(self):
        """On a signal: the running block's processes and the server go."""
        proc = self.block_proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.stop_server()

    def report(self, verdict, block, detail, seconds=None):
        self.results.append((verdict, block, detail))
        took = f" ({seconds:.1f} s)" if seconds is not None else ""
        label = f" [{block.kind}]" if block.kind else ""
        print(f"{verdict:7} {block.where}{label}{took}" + (f": {detail}" if detail else ""),
              flush=True)

    def fail(self, block, why, script=None, output=None, seconds=None):
        self.report("FAILED", block, why, seconds)
        if script is not None:
            print("  as run:\n" + tail(script, 200))
        if output:
            print("  output (last lines):\n" + tail(output))

    def run_block(self, block, file_server_ok):
        if block.error:
            self.report("NO-VERDICT" if block.marker is None else "FAILED", block, block.error)
            return
        if block.kind == "skip":
            self.report("SKIPPED", block, block.reason)
            return
        t0 = time.monotonic()
        if block.kind == "starts-server":
            port, mport, hport = free_port(), free_port(), free_port()
            try:
                script = substitute(block, dict(port=port, metrics_port=mport, http_port=hport))
            except ValueError as e:
                self.fail(block, str(e))
                return
            why = self.start_server(script, port, mport, hport, owner=block.path)
            if why:
                self.fail(block, why, script, self.server_log(), time.monotonic() - t0)
                self.stop_server()
                return
            self.report("OK", block, f"server ready on port {port}", time.monotonic() - t0)
            if self.args.verbose:
                print("  as run:\n" + tail(script, 200) + "\n  output:\n" +
                      tail(self.server_log(), 200))
            return
        server = None
        if block.kind == "server":
            if self.server is not None and self.server["owner"] == block.path:
                pass
            elif not file_server_ok:
                self.fail(block, "the server this file started did not start (above)")
                return
            else:
                why = self.ensure_shared_server()
                if why:
                    self.fail(block, f"the shared server ({SHARED_SERVER}): {why}", None,
                              self.server_log())
                    self.stop_server()
                    return
            server = self.server
            if server["proc"].poll() is not None:
                self.fail(block, "the server has exited", None, self.server_log())
                return
        try:
            script = substitute(block, server)
        except ValueError as e:
            self.fail(block, str(e))
            return
        rc, out = self.run_script(script)
        took = time.monotonic() - t0
        if server is not None and server["proc"].poll() is not None:
            self.fail(block, "the server exited while the block ran", script,
                      out + "\n--- server log:\n" + self.server_log(), took)
        elif rc is None:
            self.fail(block, f"timed out after {self.args.timeout:g} s", script, out, took)
        elif rc != 0:
            self.fail(block, f"exit status {rc}", script, out, took)
        else:
            self.report("OK", block, "", took)
            if self.args.verbose:
                print("  as run:\n" + tail(script, 200) + "\n  output:\n" + tail(out, 200))

    def run(self):
        if not os.access(self.deja, os.X_OK):
            print(f"no deja binary at {self.deja}", file=sys.stderr)
            return 1
        files = doc_files(self.source)
        if self.args.only:
            wanted = [os.path.normpath(f) for f in self.args.only]
            files = [f for f in files if os.path.normpath(f) in wanted or f in DOCS_FIRST]
        self.prepare()
        print(f"working copy: {self.work}; deja: {self.deja}", flush=True)
        t0 = time.monotonic()
        for rel in files:
            blocks = extract(self.source, rel)
            print(f"--- {rel}: {len(blocks)} shell blocks", flush=True)
            file_server_ok = True
            for b in blocks:
                classify(b)
                if time.monotonic() - t0 > self.args.total_timeout:
                    self.report("FAILED", b, f"not run: past --total-timeout "
                                f"{self.args.total_timeout:g} s")
                    continue
                self.run_block(b, file_server_ok)
                if b.kind == "starts-server":
                    file_server_ok = self.server is not None and self.server["owner"] == rel
            if self.server is not None and self.server["owner"] == rel:
                self.stop_server()
        self.stop_server()
        counts = {}
        for verdict, _, _ in self.results:
            counts[verdict] = counts.get(verdict, 0) + 1
        summary = ", ".join(f"{counts.get(v, 0)} {v.lower()}"
                            for v in ("OK", "SKIPPED", "FAILED", "NO-VERDICT"))
        print(f"=== {len(self.results)} blocks: {summary} ({time.monotonic() - t0:.0f} s)")
        bad = counts.get("FAILED", 0) + counts.get("NO-VERDICT", 0)
        if self.args.keep:
            print(f"kept: {self.tmp}")
        elif bad == 0:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
            print(f"the blocks as run and the servers' logs: {self.logs}")
        return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("--build-dir", required=True, help="the build directory (its cli/deja runs)")
    p.add_argument("--source-dir", required=True, help="the source tree, whose docs are read")
    p.add_argument("--only", nargs="+", metavar="FILE",
                   help="these docs only (relative paths), after examples/README.md")
    p.add_argument("--timeout", type=float, default=60, help="seconds per block [60]")
    p.add_argument("--total-timeout", type=float, default=240,
                   help="seconds for the whole run; blocks after it fail unrun [240]")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every block as run, with its output")
    p.add_argument("--list", action="store_true", help="print each block's verdict, run nothing")
    args = p.parse_args()
    if args.list:
        bad = 0
        for rel in doc_files(os.path.abspath(args.source_dir)):
            for b in extract(os.path.abspath(args.source_dir), rel):
                classify(b)
                what = b.error or (f"skip: {b.reason}" if b.kind == "skip" else b.kind)
                bad += b.error is not None
                print(f"{b.where}: {what}")
        return 1 if bad else 0
    runner = Runner(args)

    def on_signal(signum, _frame):
        runner.stop_all()
        if not args.keep:
            shutil.rmtree(runner.tmp, ignore_errors=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return runner.run()
    finally:
        runner.stop_server()


if __name__ == "__main__":
    sys.exit(main())
