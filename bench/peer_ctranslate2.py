"""Helper of bench/peer_ctranslate2.sh: converts an OPT checkpoint for CTranslate2, times
CTranslate2 the way `deja bench decode` times deja, and tabulates both engines' runs.

    python3 bench/peer_ctranslate2.py info
    python3 bench/peer_ctranslate2.py convert --model DIR --out DIR --quantization int8 [--converter hf|numpy]
    python3 bench/peer_ctranslate2.py run --model CT2_DIR --compute-type int8 --threads 2 ...
    python3 bench/peer_ctranslate2.py report --runs RUNS.jsonl --out FILE.json

CTranslate2 is only a measuring stick here; nothing in deja imports it. `info`, `convert` and
`run` need the venv that bench/peer_ctranslate2.sh makes; `report` needs only the standard
library."""
import argparse
import json
import os
import pathlib
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time


# ---------------------------------------------------------------------------------------------
# info


def cmd_info(args):
    import ctranslate2

    info = {
        "ctranslate2": ctranslate2.__version__,
        "cpu_compute_types": sorted(ctranslate2.get_supported_compute_types("cpu")),
    }
    print(json.dumps(info))


# ---------------------------------------------------------------------------------------------
# convert


def padded_vocab(model_dir, vocab_size):
    """The checkpoint's vocab.json, padded with placeholder tokens to the model's vocab_size.

    The random checkpoints carry a small tokenizer (8,192 tokens) beside an embedding of OPT's
    50,272 rows; CTranslate2 wants one token string per row."""
    vocab = json.loads((model_dir / "vocab.json").read_text())
    ids = set(vocab.values())
    if len(ids) != len(vocab) or ids != set(range(len(vocab))):
        raise SystemExit(f"{model_dir}/vocab.json: ids are not 0..{len(vocab) - 1}")
    i = 0
    while len(vocab) < vocab_size:
        token = f"<deja_pad_{i}>"
        i += 1
        if token not in vocab:
            vocab[token] = len(vocab)
    return vocab


def convert_hf(model_dir, out, quantization):
    """CTranslate2's own converter (ct2-transformers-converter: transformers + torch).

    It reads a staging directory of symlinks to the checkpoint with vocab.json padded to the
    model's vocab_size."""
    config = json.loads((model_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="deja-ct2-stage-") as stage:
        stage = pathlib.Path(stage)
        for f in model_dir.iterdir():
            if f.name != "vocab.json" and f.is_file():
                (stage / f.name).symlink_to(f.resolve())
        vocab = padded_vocab(model_dir, config["vocab_size"])
        (stage / "vocab.json").write_text(json.dumps(vocab))
        cmd = [str(pathlib.Path(sys.executable).parent / "ct2-transformers-converter"),
               "--model", str(stage), "--output_dir", str(out), "--quantization", quantization,
               "--force", "--low_cpu_mem_usage"]
        print("+", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)


def read_safetensors(model_dir):
    """name -> numpy array for every tensor of the checkpoint (F16, BF16, F32), memory-mapped."""
    import numpy as np

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{model_dir}: no .safetensors file")
    tensors = {}
    for path in files:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            raw = data[a:b]
            if t["dtype"] == "F16":
                arr = raw.view("<f2")
            elif t["dtype"] == "F32":
                arr = raw.view("<f4")
            elif t["dtype"] == "BF16":
                arr = (raw.view("<u2").astype(np.uint32) << 16).view("<f4")
            else:
                raise SystemExit(f"{path}: {name} has dtype {t['dtype']}")
            tensors[name] = np.ascontiguousarray(arr.reshape(t["shape"]))
    return tensors


def convert_numpy(model_dir, out, quantization):
    """The same model spec as CTranslate2's OPTLoader builds (converters/transformers.py), its
    weights read with numpy instead of torch, then CTranslate2's own validate/optimize/save.
    No torch or transformers needed (the peer venv is then ~100 MB instead of ~6 GB)."""
    import shutil

    import numpy as np
    from ctranslate2.converters import utils
    from ctranslate2.specs import common_spec, transformer_spec

    c = json.loads((model_dir / "config.json").read_text())
    if c.get("activation_function", "relu") != "relu":
        raise SystemExit("numpy converter: only ReLU OPT checkpoints")
    w = read_safetensors(model_dir)
    p = "model.decoder."
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        c["num_hidden_layers"], c["num_attention_heads"], pre_norm=c["do_layer_norm_before"],
        activation=common_spec.Activation.RELU,
        project_in_out=c["word_embed_proj_dim"] != c["hidden_size"])
    dec = spec.decoder

    def linear(s, name):
        s.weight = w[name + ".weight"]
        if name + ".bias" in w:
            s.bias = w[name + ".bias"]

    def norm(s, name):
        s.gamma, s.beta = w[name + ".weight"], w[name + ".bias"]

    dec.scale_embeddings = False
    dec.position_encodings.encodings = w[p + "embed_positions.weight"][2:]  # OPT's offset 2
    dec.embeddings.weight = w[p + "embed_tokens.weight"]
    for i, layer in enumerate(dec.layer):
        q = f"{p}layers.{i}."
        split = [common_spec.LinearSpec() for _ in range(3)]
        for s, name in zip(split, ("q_proj", "k_proj", "v_proj")):
            linear(s, q + "self_attn." + name)
        utils.fuse_linear(layer.self_attention.linear[0], split)
        linear(layer.self_attention.linear[1], q + "self_attn.out_proj")
        norm(layer.self_attention.layer_norm, q + "self_attn_layer_norm")
        linear(layer.ffn.linear_0, q + "fc1")
        linear(layer.ffn.linear_1, q + "fc2")
        norm(layer.ffn.layer_norm, q + "final_layer_norm")
    if c["word_embed_proj_dim"] != c["hidden_size"]:
        linear(dec.project_in, p + "project_in")
        linear(dec.project_out, p + "project_out")
    if p + "final_layer_norm.weight" in w:
        norm(dec.layer_norm, p + "final_layer_norm")
    # lm_head: tied to the token embedding unless the checkpoint has its own.
    dec.projection.weight = w.get("lm_head.weight", dec.embeddings.weight)
    tok = json.loads((model_dir / "tokenizer_config.json").read_text())
    spec.config.bos_token = tok.get("bos_token", "</s>")
    spec.config.eos_token = tok.get("eos_token", "</s>")
    spec.config.unk_token = tok.get("unk_token", "</s>")
    vocab = padded_vocab(model_dir, c["vocab_size"])
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    i = 0
    while len(tokens) % 8:  # as OPTLoader.get_vocabulary
        if f"madeupword{i:04d}" not in tokens:
            tokens.append(f"madeupword{i:04d}")
        i += 1
    spec.register_vocabulary(tokens)
    spec.validate()
    spec.optimize(quantization=quantization)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    spec.save(str(out))
    del np


def cmd_convert(args):
    model_dir, out = args.model.resolve(), args.out
    tmp = out.with_name(out.name + ".partial")
    t0 = time.time()
    if args.converter == "hf":
        convert_hf(model_dir, tmp, args.quantization)
    else:
        convert_numpy(model_dir, tmp, args.quantization)
    (tmp / "deja_peer_source.json").write_text(json.dumps(
        {"model": str(model_dir), "quantization": args.quantization,
         "converter": args.converter, "seconds": round(time.time() - t0, 1)}) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    print(f"converted {model_dir} to {out} ({args.quantization}, {args.converter} converter, "
          f"{time.time() - t0:.0f} s)", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# run


def cmd_run(args):
    """One CTranslate2 run with `deja bench decode`'s measurements, one JSON line on stdout:

    - prefill: a `prefill_tokens`-token prompt through generate_batch(max_length=1,
      include_prompt_in_result=False): the prompt is forwarded at once, then one greedy token,
      i.e. time to first token, which is what deja's prefill (one forward over the prompt)
      measures. forward_batch/score_batch would add the LM head over every position. Best of 3,
      as deja.
    - decode: `batch` prompts of `prompt_tokens` random tokens, `decode_steps` greedy tokens
      forced with min_length; the step time is the gap between consecutive token callbacks of
      batch entry 0 (CTranslate2 calls back from its decoding loop after each step), the median
      over the steps, as deja's median step time. One untimed warm-up generation per batch
      size first, as deja's --warmup-rounds 1."""
    import random

    import ctranslate2

    t0 = time.time()
    gen = ctranslate2.Generator(str(args.model), device="cpu", compute_type=args.compute_type,
                                intra_threads=args.threads, inter_threads=1)
    load_s = time.time() - t0
    vocab = json.loads((args.model / "vocabulary.json").read_text())
    rng = random.Random(1)
    # Random tokens, as deja draws random ids >= 4 (ids below are <s>, <pad>, </s>, <unk>).
    def prompt(n):
        return [vocab[rng.randrange(4, len(vocab))] for _ in range(n)]

    j = {"engine": "ctranslate2", "ctranslate2": ctranslate2.__version__,
         "model": str(args.model), "compute_type": args.compute_type,
         "threads": args.threads, "load_s": load_s}
    best = 1e30
    for _ in range(3):
        p = [prompt(args.prefill_tokens)]
        t = time.perf_counter()
        r = gen.generate_batch(p, max_length=1, include_prompt_in_result=False)
        best = min(best, time.perf_counter() - t)
        assert len(r[0].sequences_ids[0]) == 1
    j["prefill_tokens"] = args.prefill_tokens
    j["prefill_tokens_per_s"] = args.prefill_tokens / best
    j["decode"] = []
    for b in [int(x) for x in args.batches.split(",")]:
        for timed in (False, True):
            stamps = []

            def callback(step):
                if step.batch_id == 0:
                    stamps.append(time.perf_counter())
                return False

            prompts = [prompt(args.prompt_tokens) for _ in range(b)]
            t = time.perf_counter()
            r = gen.generate_batch(prompts, max_length=args.decode_steps + 1,
                                   min_length=args.decode_steps + 1,
                                   include_prompt_in_result=False, callback=callback)
            total = time.perf_counter() - t
        n = [len(x.sequences_ids[0]) for x in r]
        if set(n) != {args.decode_steps + 1} or len(stamps) != args.decode_steps + 1:
            raise SystemExit(f"ctranslate2 generated {sorted(set(n))} tokens, "
                             f"{len(stamps)} callbacks; wanted {args.decode_steps + 1}")
        steps = [b2 - a for a, b2 in zip(stamps, stamps[1:])]
        ms = statistics.median(steps) * 1e3
        # Cross-check independent of the callbacks: the generation's wall time less its
        # prefill and first token (up to the first callback), per remaining step.
        mean_ms = (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3
        j["decode"].append({"batch": b, "ms_per_step": ms, "tokens_per_s": b / ms * 1e3,
                            "mean_ms_per_step": mean_ms,
                            "first_token_ms": (stamps[0] - t) * 1e3,
                            "generate_s": total})
        print(f"ctranslate2 {args.compute_type} decode batch {b:3d}: {ms:8.3f} ms/step",
              file=sys.stderr)
    print(json.dumps(j))


# ---------------------------------------------------------------------------------------------
# report

METRICS = [  # key, label, unit, higher is better
    ("batch1_ms_per_token", "batch-1 decode", "ms/token", False),
    ("batch16_ms_per_step", "batch-16 decode", "ms/step", False),
    ("prefill_tokens_per_s", "prefill", "tokens/s", True),
]


def figures(run):
    out = {"prefill_tokens_per_s": run["prefill_tokens_per_s"]}
    for d in run.get("decode", []):
        if d["batch"] == 1:
            out["batch1_ms_per_token"] = d["ms_per_step"]
        elif d["batch"] == 16:
            out["batch16_ms_per_step"] = d["ms_per_step"]
    return out


def cmd_report(args):
    runs = [json.loads(line) for line in args.runs.read_text().splitlines() if line.strip()]
    meta = json.loads(args.meta.read_text()) if args.meta else {}
    by = {}  # config label -> round -> figures
    for r in runs:
        by.setdefault(r["config"], {})[r["round"]] = figures(r["result"])
    deja = [c for c in by if c.startswith("deja")]
    peer = [c for c in by if not c.startswith("deja")]
    rows = []
    for key, label, unit, higher in METRICS:
        for d in deja:
            for p in peer:
                rounds = sorted(set(by[d]) & set(by[p]))
                dv = [by[d][i][key] for i in rounds if key in by[d][i]]
                pv = [by[p][i][key] for i in rounds if key in by[p][i]]
                ratios = [(by[d][i][key] / by[p][i][key]) if higher else
                          (by[p][i][key] / by[d][i][key])
                          for i in rounds if key in by[d][i] and key in by[p][i]]
                if not ratios:
                    continue
                rows.append({"metric": key, "label": f"{label} ({unit})", "deja": d, "peer": p,
                             "deja_median": statistics.median(dv),
                             "peer_median": statistics.median(pv),
                             "speedup_median": statistics.median(ratios),
                             "speedup_range": [min(ratios), max(ratios)], "rounds": len(ratios)})
    print()
    print(f"machine: {meta.get('cpu', platform.processor())}, {meta.get('cores', os.cpu_count())} "
          f"cores; threads {meta.get('threads')}; {meta.get('date', time.strftime('%F'))}")
    print(f"model: {meta.get('model')}  ctranslate2 {meta.get('ctranslate2')} "
          f"(CPU compute types: {', '.join(meta.get('cpu_compute_types', []))})  openvino "
          f"{meta.get('openvino_info', {}).get('openvino', '-')}")
    for r in runs:  # what OpenVINO chose for itself, once per configuration
        res = r["result"]
        if res.get("engine") == "openvino" and r["round"] == 1:
            print(f"{r['config']}: inference precision {res.get('inference_precision')}, "
                  f"KV cache {res.get('kv_cache_precision')}")
    print("speedup = deja / peer from the same round (>1: deja faster), median [range]")
    print()
    head = f"{'metric':26} {'deja':18} {'peer':12} {'deja':>10} {'peer':>10} {'speedup':>18}"
    print(head)
    print("-" * len(head))
    for r in rows:
        lo, hi = r["speedup_range"]
        print(f"{r['label']:26} {r['deja']:18} {r['peer']:12} {r['deja_median']:10.2f} "
              f"{r['peer_median']:10.2f} {r['speedup_median']:7.2f}x [{lo:.2f}-{hi:.2f}]")
    for note in meta.get("notes", []):
        print("note:", note)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1)
                            + "\n")
        print(f"\nwrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info")
    c = sub.add_parser("convert")
    c.add_argument("--model", required=True, type=pathlib.Path)
    c.add_argument("--out", required=True, type=pathlib.Path)
    c.add_argument("--quantization", default="int8")
    c.add_argument("--converter", choices=["hf", "numpy"], default="hf")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, type=pathlib.Path)
    r.add_argument("--compute-type", default="int8")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--prefill-tokens", type=int, default=512)
    r.add_argument("--prompt-tokens", type=int, default=64)
    r.add_argument("--decode-steps", type=int, default=64)
    r.add_argument("--batches", default="1,16")
    p = sub.add_parser("report")
    p.add_argument("--runs", required=True, type=pathlib.Path)
    p.add_argument("--meta", type=pathlib.Path)
    p.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    {"info": cmd_info, "convert": cmd_convert, "run": cmd_run, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
