#!/usr/bin/env python3
"""Quality beside speed for bench/peer_ctranslate2.sh: every engine and mode on the trained
fixture (models/opt-mini), against Hugging Face transformers in float32, in one run:

- held-out perplexity at 1024-token windows, deja's procedure for every engine (the text's
  tokens without BOS cut into chunks of 1023; each window is [BOS] + chunk; every token after
  the BOS is scored; exp(total NLL / tokens));
- greedy agreement: the share of 32 greedy tokens equal to float32 HF's, position by position,
  on prompts cut from the held-out text.

Engines: HF float32 (the reference), deja in its modes (`--dtype bf16|int8|int4 --kv-dtype f16`, as
the speed runs), OpenVINO with int8 and int4 weights (optimum-intel exports, its defaults
otherwise) and CTranslate2 int8 when `ctranslate2` imports (converted with numpy, as
`peer_ctranslate2.py convert --converter numpy`). Run it with OpenVINO's venv (torch,
transformers, optimum-intel), which peer_ctranslate2.sh makes:

    ~/.cache/deja/peer-ov-venv/bin/python bench/peer_quality.py --deja build/release/cli/deja

Prints JSON lines and a Markdown table; --out keeps them."""
import argparse
import json
import math
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from dejavu_quality import prompts_from  # noqa: E402

TEXTS = [ROOT / "tests/data/heldout/tinyshakespeare.txt", ROOT / "tests/data/heldout/kjv.txt"]
DEJA_MODES = {"bf16": ["--dtype", "bf16", "--kv-dtype", "f16"],
              "int8": ["--dtype", "int8", "--kv-dtype", "f16"],
              "int4": ["--dtype", "int4", "--kv-dtype", "f16"]}


def windows(ids, context, bos):
    step = context - 1
    return [[bos] + ids[i:i + step] for i in range(0, len(ids), step)]


def perplexity(nll_of_window, ids, context, bos):
    total, n = 0.0, 0
    for w in windows(ids, context, bos):
        nll = nll_of_window(w)
        total += sum(nll)
        n += len(nll)
    return math.exp(total / n)


def torch_nll(logits, window):
    """-log p(window[i + 1] | window[:i + 1]) for each i, from [len, vocab] logits (float64)."""
    import torch

    lp = torch.log_softmax(logits.double(), dim=-1)
    target = torch.tensor(window[1:])
    return (-lp[:-1].gather(1, target[:, None])[:, 0]).tolist()


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--deja", default=str(ROOT / "build/release/cli/deja"))
    ap.add_argument("--deja-lab", default=str(ROOT / "build/release/lab/deja-lab"))
    ap.add_argument("--model", default=str(ROOT / "models/opt-mini"))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ov-weights", default="int8,int4")
    ap.add_argument("--work", type=pathlib.Path,
                    default=pathlib.Path.home() / ".cache/deja/peer/quality")
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    import torch
    from transformers import AutoTokenizer, OPTForCausalLM

    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    bos = tok.bos_token_id
    text_ids = {t.stem: tok(t.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
                for t in TEXTS}
    prompts = [p for t in TEXTS for p in prompts_from(t, a.prompts // len(TEXTS), 300)]
    prompt_ids = [tok(p)["input_ids"] for p in prompts]  # with BOS, as deja generate
    rows = []

    def report(engine, mode, ppl, greedy, seconds):
        row = {"engine": engine, "mode": mode, "seconds": round(seconds, 1)}
        for k, v in ppl.items():
            row["ppl_" + k] = v
        row["greedy"] = greedy
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "greedy"}), flush=True)

    # --- the reference: HF float32 ---
    t0 = time.time()
    hf = OPTForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).eval()

    def hf_nll(w):
        with torch.no_grad():
            return torch_nll(hf(torch.tensor([w])).logits[0], w)

    def greedy_torch(model, ids):
        with torch.no_grad():
            x = torch.tensor([ids])
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.new_tokens,
                                 min_new_tokens=a.new_tokens, do_sample=False, num_beams=1,
                                 pad_token_id=tok.pad_token_id)
        return out[0, len(ids):].tolist()

    report("hf", "float32", {k: perplexity(hf_nll, v, a.context, bos) for k, v in text_ids.items()},
           [greedy_torch(hf, p) for p in prompt_ids], time.time() - t0)

    # --- deja ---
    for mode, flags in DEJA_MODES.items():
        t0 = time.time()
        ppl = {t.stem: run_json([a.deja_lab, "ppl", "--model", a.model, "--text", str(t),
                                 "--context", str(a.context), "--threads", str(a.threads),
                                 "--json"] + flags)["perplexity"] for t in TEXTS}
        greedy = [run_json([a.deja, "generate", "--model", a.model, "--prompt", p,
                            "--max-new-tokens", str(a.new_tokens), "--ignore-eos", "--threads",
                            str(a.threads), "--json"] + flags)["token_ids"] for p in prompts]
        report("deja", mode, ppl, greedy, time.time() - t0)

    # --- OpenVINO ---
    sys.path.insert(0, str(ROOT / "bench"))
    import peer_openvino  # noqa: E402

    for w in [x for x in a.ov_weights.split(",") if x]:
        t0 = time.time()
        out = a.work / f"ov-opt-mini-{w}"
        if not (out / "openvino_model.xml").exists():
            peer_openvino.cmd_export(argparse.Namespace(model=pathlib.Path(a.model), out=out,
                                                        weights=w))
        ov = peer_openvino.load(out, a.threads)

        def ov_nll(win):
            with torch.no_grad():
                x = torch.tensor([win])
                return torch_nll(ov(input_ids=x, attention_mask=torch.ones_like(x)).logits[0], win)

        mode = f"{w} weights; {', '.join(f'{k} {v}' for k, v in peer_openvino.precisions(ov).items())}"
        report("openvino", mode,
               {k: perplexity(ov_nll, v, a.context, bos) for k, v in text_ids.items()},
               [greedy_torch(ov, p) for p in prompt_ids], time.time() - t0)

    # --- CTranslate2, where it imports ---
    try:
        import ctranslate2
    except ImportError:
        ctranslate2 = None
        print("note: ctranslate2 does not import here; its row is left out", file=sys.stderr)
    if ctranslate2 is not None:
        import peer_ctranslate2  # noqa: E402

        t0 = time.time()
        out = a.work / "ct2-opt-mini-int8"
        if not (out / "model.bin").exists():
            peer_ctranslate2.convert_numpy(pathlib.Path(a.model), out, "int8")
        gen = ctranslate2.Generator(str(out), device="cpu", compute_type="int8",
                                    intra_threads=a.threads)
        vocab = json.loads((out / "vocabulary.json").read_text())
        idx = {s: i for i, s in enumerate(vocab)}

        def ct2_nll(win):
            r = gen.score_batch([[vocab[i] for i in win]])[0]
            return [-x for x in r.log_probs]

        def ct2_greedy(ids):
            r = gen.generate_batch([[vocab[i] for i in ids]], max_length=a.new_tokens,
                                   min_length=a.new_tokens, include_prompt_in_result=False,
                                   sampling_topk=1)[0]
            return [idx[s] for s in r.sequences[0]]

        report("ctranslate2", "int8",
               {k: perplexity(ct2_nll, v, a.context, bos) for k, v in text_ids.items()},
               [ct2_greedy(p) for p in prompt_ids], time.time() - t0)

    base = rows[0]
    for r in rows:
        agree = [sum(x == y for x, y in zip(g, b)) / len(b)
                 for g, b in zip(r["greedy"], base["greedy"])]
        r["greedy_agreement"] = sum(agree) / len(agree)
    stems = [t.stem for t in TEXTS]
    print(f"\nopt-mini, {len(prompts)} prompts x {a.new_tokens} greedy tokens, windows of "
          f"{a.context}; {time.strftime('%Y-%m-%d')}\n")
    print("| engine | mode | " + " | ".join(f"ppl {s} (vs HF f32)" for s in stems) +
          " | greedy agreement with HF f32 |")
    print("| --- | --- | " + " | ".join("---" for _ in stems) + " | --- |")
    for r in rows:
        cells = [f"{r['ppl_' + s]:.3f} ({100 * (r['ppl_' + s] / base['ppl_' + s] - 1):+.2f}%)"
                 for s in stems]
        print(f"| {r['engine']} | {r['mode']} | " + " | ".join(cells) +
              f" | {r['greedy_agreement']:.3f} |")
    if a.out:
        a.out.write_text(json.dumps([{k: v for k, v in r.items() if k != "greedy"} for r in rows],
                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
