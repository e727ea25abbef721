#!/usr/bin/env python3
"""Deja Vu quality on the fixture, one run: the predictors' per-layer recall and precision (from
their JSON), then for each schedule the held-out perplexity (every token computed with its own
predicted heads and neurons) and the 32-token greedy agreement with dense decoding on prompts
cut from the held-out text. Prints JSON lines and a Markdown table.

    python3 bench/dejavu_quality.py --deja build/release/cli/deja \\
        --schedule trained= --schedule "mlp30=--mlp-fraction 0.3" ...

Each --schedule is NAME=EXTRA FLAGS for deja (schedule overrides); "dense" is always measured."""
import argparse
import json
import pathlib
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def prompts_from(path, n, chars):
    text = path.read_text(encoding="utf-8")
    out, step = [], max(1, len(text) // (n + 1))
    for i in range(n):
        start = text.find("\n", i * step) + 1
        chunk = text[start:start + chars]
        chunk = chunk[:chunk.rfind(" ")] if " " in chunk else chunk
        out.append(chunk)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--deja", default=str(ROOT / "build/release/cli/deja"))
    ap.add_argument("--model", default=str(ROOT / "models/opt-mini"))
    ap.add_argument("--predictors", default=str(ROOT / "models/opt-mini/predictors.safetensors"))
    ap.add_argument("--text", action="append", default=[])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-chars", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--schedule", action="append", default=[])
    a = ap.parse_args()
    texts = [pathlib.Path(t) for t in (a.text or [ROOT / "tests/data/heldout/tinyshakespeare.txt",
                                                  ROOT / "tests/data/heldout/kjv.txt"])]
    schedules = [("dense", None)]
    for s in a.schedule or ["trained="]:
        name, _, extra = s.partition("=")
        schedules.append((name, ["--predictors", a.predictors] + shlex.split(extra)))

    meta = json.loads(pathlib.Path(a.predictors).with_suffix(".json").read_text())
    print("# predictors: per-layer schedule, recall and precision on the trainer's validation rows")
    for layer in meta["layers"]:
        brief = {k: {f: v for f, v in layer[k].items() if f in ("top_k", "recall", "precision")}
                 for k in ("mlp", "heads")}
        print(json.dumps({"layer": layer["layer"], **brief}))

    rows = []
    for name, flags in schedules:
        row = {"schedule": name, "flags": " ".join(flags[2:]) if flags else ""}
        for t in texts:
            cmd = [a.deja, "ppl", "--model", a.model, "--text", str(t), "--context",
                   str(a.context), "--json"] + (flags or [])
            row["ppl_" + t.stem] = run_json(cmd)["perplexity"]
        # Greedy agreement with dense: per prompt, the share of the new tokens equal position by
        # position, and the length of the identical prefix.
        agree, prefix = [], []
        for t in texts:
            for p in prompts_from(t, a.prompts // len(texts), a.prompt_chars):
                base = [a.deja, "generate", "--model", a.model, "--prompt", p, "--max-new-tokens",
                        str(a.new_tokens), "--ignore-eos", "--json"]
                d = run_json(base)["token_ids"]
                s = run_json(base + (flags or []))["token_ids"]
                same = [x == y for x, y in zip(d, s)]
                agree.append(sum(same) / len(d))
                prefix.append(next((i for i, ok in enumerate(same) if not ok), len(same)))
        row["greedy_agreement"] = sum(agree) / len(agree)
        row["greedy_identical_prefix"] = sum(prefix) / len(prefix)
        row["greedy_prompts"] = len(agree)
        if flags:
            bench = run_json([a.deja, "bench", "decode", "--model", a.model, "--batches", "1",
                              "--prefill-tokens", "64", "--decode-steps", "64", "--json"] + flags)
            sp = bench["decode"][0]["sparse"]
            row["active_head_fraction"] = sp["active_head_fraction"]
            row["active_neuron_fraction"] = sp["active_neuron_fraction"]
        print(json.dumps(row), flush=True)
        rows.append(row)

    dense = rows[0]
    print("\n| schedule | flags | " + " | ".join(f"ppl {t.stem} (vs dense)" for t in texts) +
          " | heads kept | neurons kept | greedy agreement | identical prefix |")
    print("|---|---|" + "---|" * len(texts) + "---|---|---|---|")
    for r in rows:
        ppl = " | ".join(f"{r['ppl_' + t.stem]:.2f} ({(r['ppl_' + t.stem] / dense['ppl_' + t.stem] - 1) * 100:+.2f}%)"
                         for t in texts)
        print(f"| {r['schedule']} | {r['flags'] or '-'} | {ppl} | "
              f"{r.get('active_head_fraction', 1):.3f} | {r.get('active_neuron_fraction', 1):.3f} | "
              f"{r['greedy_agreement']:.3f} | {r['greedy_identical_prefix']:.1f} / {a.new_tokens} |")


if __name__ == "__main__":
    sys.exit(main())
