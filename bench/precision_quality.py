#!/usr/bin/env python3
"""Quality of the reduced-precision modes on the fixture, one run: held-out perplexity at
1024-token windows and the 32-token greedy agreement with the default mode (checkpoint-dtype
weights, f32 activations, f32 KV cache) on prompts cut from the held-out text, for `--dtype bf16`,
`--dtype int8`, `--dtype int4`, `--kv-dtype f16`, `--kv-dtype int8` and their pairs. Prints JSON lines and a Markdown table.

    python3 bench/precision_quality.py --deja build/release/cli/deja --deja-lab build/release/lab/deja-lab"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from dejavu_quality import ROOT, prompts_from, run_json  # noqa: E402

# Every mode names both flags: the server's own default (`auto`) is one of the rows below.
MODES = [("checkpoint", ["--dtype", "checkpoint", "--kv-dtype", "f32"]),
         ("bf16 weights", ["--dtype", "bf16", "--kv-dtype", "f32"]),
         ("f16 KV cache", ["--dtype", "checkpoint", "--kv-dtype", "f16"]),
         ("bf16 + f16 KV", ["--dtype", "bf16", "--kv-dtype", "f16"]),
         ("int8 weights", ["--dtype", "int8", "--kv-dtype", "f32"]),
         ("int8 + f16 KV", ["--dtype", "int8", "--kv-dtype", "f16"]),
         ("int4 weights", ["--dtype", "int4", "--kv-dtype", "f32"]),
         ("int4 + f16 KV", ["--dtype", "int4", "--kv-dtype", "f16"]),
         ("int8 KV cache", ["--dtype", "checkpoint", "--kv-dtype", "int8"]),
         ("int8 + int8 KV", ["--dtype", "int8", "--kv-dtype", "int8"]),
         ("int4 + int8 KV", ["--dtype", "int4", "--kv-dtype", "int8"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--deja", default=str(ROOT / "build/release/cli/deja"))
    ap.add_argument("--deja-lab", default=str(ROOT / "build/release/lab/deja-lab"))
    ap.add_argument("--model", default=str(ROOT / "models/opt-mini"))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--only", default="",
                    help="comma-separated mode-name prefixes to run (the checkpoint row, the "
                         "baseline, always runs), e.g. int8,int4")
    a = ap.parse_args()
    prefixes = [p for p in a.only.split(",") if p]
    modes = [m for i, m in enumerate(MODES)
             if i == 0 or not prefixes or any(m[0].startswith(p) for p in prefixes)]
    texts = [ROOT / "tests/data/heldout/tinyshakespeare.txt", ROOT / "tests/data/heldout/kjv.txt"]
    prompts = [p for t in texts for p in prompts_from(t, a.prompts // len(texts), 300)]
    outputs, rows = {}, []
    for name, flags in modes:
        row = {"mode": name, "flags": " ".join(flags)}
        for t in texts:
            row["ppl_" + t.stem] = run_json([a.deja_lab, "ppl", "--model", a.model, "--text", str(t),
                                             "--context", "1024", "--json"] + flags)["perplexity"]
        outputs[name] = [run_json([a.deja, "generate", "--model", a.model, "--prompt", p,
                                   "--max-new-tokens", str(a.new_tokens), "--ignore-eos",
                                   "--json"] + flags)["token_ids"] for p in prompts]
        agree = [sum(x == y for x, y in zip(d, s)) / len(d)
                 for d, s in zip(outputs[MODES[0][0]], outputs[name])]
        row["greedy_agreement"] = sum(agree) / len(agree)
        row["greedy_prompts"] = len(agree)
        print(json.dumps(row), flush=True)
        rows.append(row)
    base = rows[0]
    print("\n| mode | flags | " + " | ".join(f"ppl {t.stem} (vs checkpoint)" for t in texts) +
          " | greedy agreement |")
    print("| --- | --- | " + " | ".join("---" for _ in texts) + " | --- |")
    for r in rows:
        cells = [f"{r['ppl_' + t.stem]:.3f} ({100 * (r['ppl_' + t.stem] / base['ppl_' + t.stem] - 1):+.3f}%)"
                 for t in texts]
        print(f"| {r['mode']} | {r['flags']} | " + " | ".join(cells) +
              f" | {r['greedy_agreement']:.3f} |")


if __name__ == "__main__":
    main()
