#!/usr/bin/env bash
# Regenerates the committed seed corpora (tests/fuzz/corpus/<target>/) with fuzz_make_seeds, built
# by the fuzz preset. Deterministic: running it again changes nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" --target fuzz_make_seeds
ASAN_OPTIONS=detect_leaks=0 build/fuzz/tests/fuzz/fuzz_make_seeds "$PWD" tests/fuzz/corpus
ls tests/fuzz/corpus/*
