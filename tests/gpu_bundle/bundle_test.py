"""The GPU bundle without a GPU: scripts/gpu_bundle.sh packs a closed set of binaries and
libraries under the size that travels to a GPU machine, and scripts/gpu_check.sh, run from the
unpacked bundle on the CPU, writes exactly summary.json and logs.tar.xz into $OUT.

    python3 bundle_test.py --source DIR --build DIR (pack|closure|check)

pack     builds the bundle (into BUILD/gpu-bundle-test) and holds gpu-bundle.tar.xz under 35 MB
closure  every library ldd resolves for the bundled binaries is in the bundle, in glibc or the
         compiler's runtime, or a CUDA library every CUDA machine has; and a bundle with one
         library taken out fails that check (the check can fail)
check    gpu_check.sh with DEJA_CHECK_DEVICE=cpu from the unpacked bundle"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

MAX_PACKED_BYTES = 35 * 2**20
# glibc and the dynamic loader, the compiler's runtime: every Linux machine has them.
SYSTEM = re.compile(r"^(libc|libm|libdl|librt|libpthread|libresolv|libutil|ld-linux-x86-64|"
                    r"linux-vdso|libstdc\+\+|libgcc_s)\.so")
# What every CUDA machine has: the driver, cuBLAS/cuBLASLt (toolkit or nvidia-* wheels), NCCL.
CUDA = re.compile(r"^(libcuda|libcublas|libcublasLt|libnccl)\.so")


def pack(source, build):
    out = build / "gpu-bundle-test" / "gpu-bundle"
    env = dict(os.environ, DEJA_GPU_BUILD_DIR=str(build))
    subprocess.run(["bash", str(source / "scripts" / "gpu_bundle.sh"), str(out)], check=True,
                   env=env)
    return out


def bundle_dir(build):
    out = build / "gpu-bundle-test" / "gpu-bundle"
    if not (out / "bin" / "deja").exists():
        sys.exit(f"no bundle in {out}: run the pack test first")
    return out


def closure_problems(bundle):
    """(binary, library, where it resolved) for each library that comes from neither the bundle
    nor the allowed system and CUDA sets."""
    lib = bundle / "lib"
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib))
    problems = []
    files = sorted((bundle / "bin").iterdir()) + sorted(lib.iterdir())
    for f in files:
        out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, env=env).stdout
        for line in out.splitlines():
            m = re.match(r"\s*(\S+)\s*=>\s*(.*?)\s*(\(0x[0-9a-f]+\))?$", line)
            if not m:
                continue
            name, where = m.group(1), m.group(2)
            if SYSTEM.match(name) or CUDA.match(name):
                continue
            if where == "not found" or not os.path.realpath(where).startswith(str(lib.resolve())):
                problems.append((f.name, name, where))
    return problems


def test_pack(source, build):
    bundle = pack(source, build)
    packed = bundle.parent / "gpu-bundle.tar.xz"
    size = packed.stat().st_size
    print(f"{packed}: {size / 2**20:.1f} MiB (limit {MAX_PACKED_BYTES / 2**20:.0f})")
    assert size < MAX_PACKED_BYTES, f"the bundle is {size} bytes, over {MAX_PACKED_BYTES}"
    tests = (bundle / "gpu_tests.txt").read_text().split("\n")
    tests = [t for t in tests if t.strip()]
    assert tests, "gpu_tests.txt lists no test binary"
    for t in tests:
        binary = t.split()[0]
        assert (bundle / "bin" / binary).exists(), f"{binary} of gpu_tests.txt is not bundled"
    assert (bundle / "COMMIT").read_text().strip(), "no COMMIT"


def test_closure(build):
    bundle = bundle_dir(build)
    problems = closure_problems(bundle)
    for p in problems:
        print("outside the bundle: %s needs %s (%s)" % p)
    assert not problems, f"{len(problems)} libraries come from outside the bundle"
    # The check fails when a library is left out: take the first bundled one the deja binary
    # needs away in a copy.
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "b"
        shutil.copytree(bundle / "bin", copy / "bin", symlinks=True)
        shutil.copytree(bundle / "lib", copy / "lib", symlinks=True)
        victim = sorted(p for p in (copy / "lib").iterdir() if p.name.startswith("libglog"))[0]
        victim.unlink()
        missing = closure_problems(copy)
        assert any(p[1] == victim.name for p in missing), \
            f"taking {victim.name} out of the bundle went unnoticed: {missing}"
        print(f"with {victim.name} taken out: {len(missing)} problems, e.g. {missing[0]}")


def test_check(build):
    bundle = bundle_dir(build)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        with tarfile.open(bundle.parent / "gpu-bundle.tar.xz") as t:
            t.extractall(tmp, filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(tmp)
        out = tmp / "out"
        out.mkdir()
        env = dict(os.environ, OUT=str(out), DEJA_CHECK_DEVICE="cpu",
                   DEJA_CHECK_STEPS="env tests generate serve bench dejavu peer sanitize")
        env.pop("DEJA_SOURCE_DIR", None)
        r = subprocess.run(["bash", str(tmp / "gpu-bundle" / "gpu_check.sh")], env=env,
                           capture_output=True, text=True, timeout=600)
        print(r.stdout[-6000:], r.stderr[-3000:])
        assert sorted(p.name for p in out.iterdir()) == ["logs.tar.xz", "summary.json"], \
            list(out.iterdir())
        summary = json.loads((out / "summary.json").read_text())
        status = {s["step"]: s["status"] for s in summary["steps"]}
        for step in ("env", "tests", "generate", "serve", "bench", "dejavu"):
            assert status.get(step) == "PASS", f"{step}: {status.get(step)}"
        bench = next(s for s in summary["steps"] if s["step"] == "bench")["figures"]
        assert bench["batch1_ms_per_step"] > 0 and bench["prefill_tokens_per_s"] > 0, bench
        serve = next(s for s in summary["steps"] if s["step"] == "serve")["figures"]
        assert serve["greedy_same"] == serve["greedy_cases"], serve
        assert summary["commit"] != "unknown"
        with tarfile.open(out / "logs.tar.xz") as t:
            names = t.getnames()
        for want in ("logs/env.log", "logs/tests.log", "logs/serve.log", "logs/bench.json",
                     "figures/bench.json"):
            assert want in names, f"{want} not in logs.tar.xz: {names}"
        tail = r.stdout.splitlines()[-60:]
        assert any("summary" in line for line in tail), "the summary is not in the last 60 lines"
        assert r.returncode == 0, f"gpu_check.sh exited {r.returncode}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=pathlib.Path, required=True)
    ap.add_argument("--build", type=pathlib.Path, required=True)
    ap.add_argument("part", choices=["pack", "closure", "check"])
    a = ap.parse_args()
    if a.part == "pack":
        test_pack(a.source, a.build)
    elif a.part == "closure":
        test_closure(a.build)
    else:
        test_check(a.build)
    print("ok")


if __name__ == "__main__":
    main()
