#!/usr/bin/env python3
"""deploy/ against the Kubernetes schemas and against the server it describes.

  validate  every overlay renders (`kubectl kustomize`); each core object validates strictly
            against the bundled Kubernetes schemas (PyPI kubernetes-validate, no network), the
            LeaderWorkerSet against its CRD's openAPIV3Schema ($DEJA_K8S_SCHEMAS, or the nearest
            shared/k8s-schemas beside or above the checkout or the one it was cloned from), the Prometheus Operator objects structurally (no CRD offline);
            and the pod rules hold: non-root, read-only root filesystem, resources, gRPC probes
            on the API container, a termination grace longer than the drain plus the preStop.
  images    Dockerfile.cpu and Dockerfile.cuda: multi-stage, built by the project's own scripts,
            a non-root user, a HEALTHCHECK, the bundled model optional; and the runtime stage's
            packages (with their dependencies, as apt resolves them here) provide every shared
            library `ldd` finds in the built binary (the CUDA ones in Dockerfile.cuda). The
            images themselves are not built here (no container daemon).
  run       the `cpu` overlay's container (command, args with its ConfigMap's values expanded,
            env, ports) runs as a local process (the image's /opt/deja is this checkout; the
            ports are free ones); the startup, readiness and liveness probes the manifest
            declares pass (gRPC health, as the kubelet asks), and SIGTERM drains it to exit
            within the termination grace.

    deploy_test.py --deja build/release/cli/deja --source . [validate|images|run ...]
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import FAILURES, check, run_parts  # noqa: E402

OVERLAYS = ["cpu", "single-node-gpu", "multi-node"]


def render(source, overlay):
    r = subprocess.run(["kubectl", "kustomize", os.path.join(source, "deploy/overlays", overlay)],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"{overlay}: kubectl kustomize renders" + (
        "" if r.returncode == 0 else ": " + r.stderr[-2000:]))
    return [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []


def pod_specs(doc):
    """(name, pod spec) of every pod template in a workload."""
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]
    elif doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        yield doc["metadata"]["name"] + "/leader", t["leaderTemplate"]["spec"]
        yield doc["metadata"]["name"] + "/worker", t["workerTemplate"]["spec"]


def flag(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def check_pod_rules(overlay, name, spec, config):
    where = f"{overlay}: {name}"
    check(spec.get("securityContext", {}).get("runAsNonRoot") is True, f"{where} runs as non-root")
    for c in spec["containers"]:
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False,
              f"{cw}: read-only root filesystem, no privilege escalation")
        res = c.get("resources", {})
        check("requests" in res and "memory" in res.get("limits", {}),
              f"{cw}: resource requests and a memory limit")
        check("livenessProbe" in c, f"{cw}: a liveness probe")
        if any(p.get("containerPort") == 50051 for p in c.get("ports", [])):
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                check("grpc" in c.get(probe, {}), f"{cw}: gRPC {probe}")
            check(c["readinessProbe"]["grpc"].get("service") == "deja.v1.TextGeneration",
                  f"{cw}: readiness asks the serving status of deja.v1.TextGeneration")
            drain_ms = int(config.get("DEJA_DRAIN_TIMEOUT_MS", "30000"))
            pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            pause = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
            grace = spec.get("terminationGracePeriodSeconds", 30)
            check(grace > drain_ms / 1000 + pause,
                  f"{cw}: termination grace {grace} s > drain {drain_ms / 1000} s + preStop {pause} s")
    mounts = {m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
    check("/dev/shm" in mounts, f"{where}: /dev/shm mounted (a memory emptyDir)")
    shm = [v for v in spec.get("volumes", []) if v["name"] == "shm"]
    check(bool(shm) and shm[0].get("emptyDir", {}).get("medium") == "Memory",
          f"{where}: /dev/shm is a memory emptyDir")


def test_validate(source):
    import jsonschema
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    # $DEJA_K8S_SCHEMAS, else the nearest shared/k8s-schemas beside the checkout or above it
    # (the workspace keeps it at ../shared; a clone elsewhere finds it further up).
    # A clean clone elsewhere (CI's) looks beside and above the checkout it was cloned from.
    schemas = os.environ.get("DEJA_K8S_SCHEMAS")
    starts = [os.path.abspath(source)]
    origin = subprocess.run(["git", "-C", source, "config", "remote.origin.url"],
                            capture_output=True, text=True).stdout.strip()
    if origin and os.path.isdir(origin):
        starts.append(os.path.abspath(origin))
    for start in starts if not schemas else []:
        d = start
        while not schemas:
            candidate = os.path.join(d, "shared", "k8s-schemas")
            if os.path.isdir(candidate):
                schemas = candidate
            elif os.path.dirname(d) == d:
                break
            d = os.path.dirname(d)
    schemas = schemas or os.path.join(source, "..", "shared", "k8s-schemas")
    crd_path = os.path.join(schemas, "leaderworkerset.x-k8s.io_leaderworkersets.yaml")
    check(os.path.exists(crd_path), f"the LeaderWorkerSet CRD at {crd_path}")
    lws_schema = None
    if os.path.exists(crd_path):
        crd = yaml.safe_load(open(crd_path))
        lws_schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]
                          if v["name"] == "v1")
    for overlay in OVERLAYS:
        docs = render(source, overlay)
        kinds = [d["kind"] for d in docs]
        print(f"{overlay}: {', '.join(kinds)}")
        config = next((d["data"] for d in docs if d["kind"] == "ConfigMap"
                       and d["metadata"]["name"] == "deja-flags"), {})
        for d in docs:
            what = f"{overlay}: {d['kind']}/{d['metadata']['name']}"
            group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
            if d["kind"] == "LeaderWorkerSet":
                if lws_schema is not None:
                    errors = sorted(jsonschema.Draft7Validator(lws_schema).iter_errors(d),
                                    key=lambda e: list(e.path))
                    check(not errors, f"{what} validates against the LWS CRD" +
                          "".join(f"\n      {list(e.path)}: {e.message[:300]}" for e in errors[:5]))
            elif group == "monitoring.coreos.com":
                spec = d.get("spec", {})
                ok = (d["apiVersion"] == "monitoring.coreos.com/v1" and
                      (spec.get("groups") if d["kind"] == "PrometheusRule"
                       else spec.get("podMetricsEndpoints") and spec.get("selector")))
                check(bool(ok), f"{what}: Prometheus Operator v1 fields (no CRD schema offline)")
            else:
                try:
                    kubernetes_validate.validate(d, version, strict=True)
                    check(True, f"{what} validates (Kubernetes {version}, strict)")
                except kubernetes_validate.ValidationError as e:
                    check(False, f"{what}: {e.message[:500]} at {list(e.path)}")
            for name, spec in pod_specs(d):
                check_pod_rules(overlay, name, spec, config)
        if overlay == "multi-node":
            check("Deployment" not in kinds and "LeaderWorkerSet" in kinds,
                  "multi-node: the LeaderWorkerSet replaces the Deployment")
            lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
            check(lws["spec"]["leaderWorkerTemplate"].get("restartPolicy") ==
                  "RecreateGroupOnPodRestart", "multi-node: a failed pod restarts the whole group")
        check_inference_pool(source, overlay, docs)
        if overlay == "single-node-gpu":
            c = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
            check(config.get("DEJA_DEVICE") == "cuda" and config.get("DEJA_TP") == "8" and
                  c["resources"]["limits"].get("nvidia.com/gpu") == "8",
                  "single-node-gpu: --device cuda --tp 8 on 8 GPUs")


def check_inference_pool(source, overlay, docs):
    """deploy/gateway: the InferencePool's fields (no CRD offline: its v1 shape checked here),
    its selector picks the overlay's server pods and its port is their OpenAI API's; the
    HTTPRoute sends /v1/ to the pool."""
    pool_docs = list(yaml.safe_load_all(open(os.path.join(source,
                                                          "deploy/gateway/inference-pool.yaml"))))
    pool = next(d for d in pool_docs if d["kind"] == "InferencePool")
    route = next(d for d in pool_docs if d["kind"] == "HTTPRoute")
    spec = pool["spec"]
    ports = [p.get("number") for p in spec.get("targetPorts", [])]
    check(pool["apiVersion"] == "inference.networking.k8s.io/v1" and
          spec.get("selector", {}).get("matchLabels") and 1 <= len(ports) <= 8 and
          all(isinstance(p, int) and 0 < p < 65536 for p in ports) and
          spec.get("endpointPickerRef", {}).get("name") and
          set(spec) <= {"selector", "targetPorts", "endpointPickerRef"},
          f"{overlay}: InferencePool has the v1 fields (selector, targetPorts, endpointPickerRef)")
    servers = []
    for d in docs:
        for name, pod in pod_specs(d):
            meta = (d["spec"]["template"] if d["kind"] != "LeaderWorkerSet" else
                    d["spec"]["leaderWorkerTemplate"]["leaderTemplate"])["metadata"]
            if not name.endswith("/worker"):
                servers.append((meta.get("labels", {}), pod))
    wanted = spec.get("selector", {}).get("matchLabels", {})
    picked = [pod for labels, pod in servers if wanted.items() <= labels.items()]
    http = {p["containerPort"] for pod in picked for c in pod["containers"]
            for p in c.get("ports", []) if p.get("name") == "http"}
    check(bool(picked) and ports and ports[0] in http,
          f"{overlay}: the InferencePool selects the server pods, on their http port {sorted(http)}")
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    check(backend.get("kind") == "InferencePool" and backend.get("name") == pool["metadata"]["name"]
          and route["spec"]["rules"][0]["matches"][0]["path"]["value"] == "/v1/",
          f"{overlay}: the HTTPRoute sends /v1/ to the pool")


# CUDA libraries (not Debian's) and the NVIDIA packages that ship them.
CUDA_PACKAGES = {"libcudart": "cuda-cudart-13-0", "libcublas": "libcublas-13-0",
                 "libcublasLt": "libcublas-13-0", "libnccl": "libnccl2"}


def runtime_packages(dockerfile):
    """The packages the `base` stage installs."""
    stage = re.search(r"^FROM \S+ AS base\n(.*?)(?=^FROM )", dockerfile, re.S | re.M).group(1)
    run = re.search(r"apt-get install -y --no-install-recommends \\\n(.*?)&&", stage, re.S).group(1)
    return run.replace("\\", " ").split()


def apt_closure(packages):
    out = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"]
                         + packages, capture_output=True, text=True).stdout
    closure = set(packages)
    for line in out.splitlines():
        m = re.match(r"\s*(?:\|)?(?:Pre)?Depends: <?([^>\s]+)>?", line)
        if m:
            closure.add(m.group(1).split(":")[0])
        elif line and not line.startswith(" "):
            closure.add(line.strip().split(":")[0])
    return closure


def owner(path):
    for p in (path, re.sub(r"^/usr/lib/", "/lib/", path), re.sub(r"^/lib/", "/usr/lib/", path)):
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0]
    return None


def required(package):
    r = subprocess.run(["apt-cache", "show", package], capture_output=True, text=True)
    return "Priority: required" in r.stdout


def test_images(source, deja):
    cpu = open(os.path.join(source, "Dockerfile.cpu")).read()
    cuda = open(os.path.join(source, "Dockerfile.cuda")).read()
    for name, text in (("Dockerfile.cpu", cpu), ("Dockerfile.cuda", cuda)):
        check(len(re.findall(r"^FROM ", text, re.M)) >= 3, f"{name}: multi-stage")
        check("bash scripts/install_deps.sh && bash scripts/build.sh" in text,
              f"{name}: the build stage runs the project's install and build scripts")
        check(re.search(r"^USER 10001", text, re.M) is not None, f"{name}: a non-root user")
        check(re.search(r"^HEALTHCHECK .*deja.*health", text, re.M | re.S) is not None,
              f"{name}: a HEALTHCHECK")
        check("ARG BUNDLE_MODEL" in text and '"$BUNDLE_MODEL" = 1' in text and
              "COPY --from=build /out/models /opt/deja/models" in text,
              f"{name}: the bundled model optional (BUNDLE_MODEL)")
        check(re.search(r"^FROM \S*\$", text, re.M) is None,
              f"{name}: no FROM names a stage through an ARG (buildah 1.28 does not build it)")
    cpu_closure = apt_closure(runtime_packages(cpu))
    cuda_listed = set(runtime_packages(cuda))
    ldd = subprocess.run(["ldd", deja], capture_output=True, text=True).stdout
    for m in re.finditer(r"^\s*(\S+) => (\S+)", ldd, re.M):
        lib, path = m.group(1), m.group(2)
        stem = lib.split(".so")[0]
        if "/cuda" in path:
            pkg = CUDA_PACKAGES.get(stem)
            check(pkg is not None and pkg in cuda_listed,
                  f"{lib} (CUDA) comes with Dockerfile.cuda's {pkg}")
            continue
        pkg = owner(os.path.realpath(path)) or owner(path)
        check(pkg is not None and (pkg in cpu_closure or required(pkg)),
              f"{lib} comes with the runtime stage ({pkg})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run(source, deja):
    docs = render(source, "cpu")
    if not docs:
        return
    config = next(d["data"] for d in docs if d["kind"] == "ConfigMap")
    spec = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    c = spec["containers"][0]
    env = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        env[e["name"]] = config[ref["key"]] if ref else e.get("value", "")
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
    # The image's layout: /opt/deja is this checkout. Ports: free ones instead of the pod's.
    args = [a.replace("/opt/deja/", source.rstrip("/") + "/") for a in args]
    ports = {p["containerPort"]: free_port() for p in c["ports"]}
    args = [re.sub(r"^(--(?:port|metrics-port|http-port))=(\d+)$",
                   lambda m: f"{m.group(1)}={ports[int(m.group(2))]}", a) for a in args]
    args = [a.replace("--host=0.0.0.0", "--host=127.0.0.1") for a in args]
    cmd = [deja if c["command"][0] == "deja" else c["command"][0]] + args
    print("running: " + " ".join(cmd), flush=True)
    with tempfile.TemporaryDirectory() as d:
        log = open(os.path.join(d, "pod.log"), "w+")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **env))
        try:
            def probe(p):
                g = p["grpc"]
                target = f"127.0.0.1:{ports[g['port']]}"
                r = subprocess.run([deja, "client", "health", "--target", target, "--service",
                                    g.get("service", ""), "--timeout-ms",
                                    str(1000 * p.get("timeoutSeconds", 1))],
                                   capture_output=True, text=True)
                return r.returncode == 0 and "SERVING" in r.stdout
            sp = c["startupProbe"]
            started = False
            for _ in range(sp.get("failureThreshold", 3)):
                if proc.poll() is not None:
                    break
                if probe(sp):
                    started = True
                    break
                time.sleep(min(sp.get("periodSeconds", 10), 1))
            check(started, "cpu overlay: the startup probe passes")
            check(probe(c["readinessProbe"]), "cpu overlay: the readiness probe passes")
            check(probe(c["livenessProbe"]), "cpu overlay: the liveness probe passes")
            # The OpenAI-compatible API on the port the manifest names for it.
            http = next((p["containerPort"] for p in c["ports"] if p["name"] == "http"), None)
            ok = False
            if http is not None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{ports[http]}/health",
                                                timeout=5) as r:
                        ok = r.status == 200
                except OSError:
                    pass
            check(ok, "cpu overlay: the OpenAI API's /health answers 200 on the http port")
            t0 = time.time()
            proc.send_signal(signal.SIGTERM)
            grace = spec.get("terminationGracePeriodSeconds", 30)
            try:
                code = proc.wait(timeout=grace)
                check(code == 0, f"cpu overlay: SIGTERM drains and exits 0 in {time.time() - t0:.1f} s")
            except subprocess.TimeoutExpired:
                check(False, f"cpu overlay: exits within the termination grace of {grace} s")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if FAILURES:
                log.seek(0)
                print(log.read()[-3000:])


if __name__ == "__main__":
    run_parts({"validate": lambda source, deja: test_validate(source),
               "images": test_images, "run": test_run})
