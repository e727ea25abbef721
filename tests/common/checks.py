"""The harness of deja's Python test scripts (tests/monitoring, tests/deploy): named checks that
print ok/FAIL and are tallied, and a main that runs the parts named on the command line.
"""
import argparse
import sys

FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def run_parts(parts):
    """parts: name -> fn(source, deja), in their default order. Exit status 1 if a check failed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("parts", nargs="*", default=list(parts), choices=list(parts))
    a = ap.parse_args()
    for name in a.parts:
        print(f"== {name}", flush=True)
        parts[name](a.source, a.deja)
    if FAILURES:
        print(f"{len(FAILURES)} checks failed:\n  " + "\n  ".join(FAILURES))
        sys.exit(1)
    print("all checks passed")
