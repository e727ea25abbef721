"""Write a random-weight OPT checkpoint of any released shape, in the Hugging Face layout
(config.json, fp16 model.safetensors or shards, the fixture's tokenizer files), for benchmarks.

    python3 tools/checkpoints/make_random_opt.py --shape 1.3b --out build/models/opt-1.3b-random

Only numpy is needed; the safetensors file is written directly (header + raw little-endian data).
Weights are N(0, 0.02) like OPT's initialisation; LayerNorms are 1/0, biases 0."""
import argparse
import json
import pathlib
import shutil
import struct

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]

# hidden, layers, heads, ffn, word_embed_proj_dim, pre-LN (from the released configs)
SHAPES = {
    "125m": (768, 12, 12, 3072, 768, True),
    "350m": (1024, 24, 16, 4096, 512, False),
    "1.3b": (2048, 24, 32, 8192, 2048, True),
    "2.7b": (2560, 32, 32, 10240, 2560, True),
    "6.7b": (4096, 32, 32, 16384, 4096, True),
    "13b": (5120, 40, 40, 20480, 5120, True),
    "30b": (7168, 48, 56, 28672, 7168, True),
    "66b": (9216, 64, 72, 36864, 9216, True),
    "175b": (12288, 96, 96, 49152, 12288, True),
}


def tensor_specs(hidden, layers, ffn, proj, pre_ln, vocab, max_pos):
    p = "model.decoder."
    yield p + "embed_tokens.weight", (vocab, proj), "normal"
    yield p + "embed_positions.weight", (max_pos + 2, hidden), "normal"
    if proj != hidden:
        yield p + "project_in.weight", (hidden, proj), "normal"
        yield p + "project_out.weight", (proj, hidden), "normal"
    if pre_ln:
        yield p + "final_layer_norm.weight", (hidden,), "ones"
        yield p + "final_layer_norm.bias", (hidden,), "zeros"
    for layer in range(layers):
        q = f"{p}layers.{layer}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield q + f"self_attn.{name}.weight", (hidden, hidden), "normal"
            yield q + f"self_attn.{name}.bias", (hidden,), "zeros"
        for ln in ("self_attn_layer_norm", "final_layer_norm"):
            yield q + f"{ln}.weight", (hidden,), "ones"
            yield q + f"{ln}.bias", (hidden,), "zeros"
        yield q + "fc1.weight", (ffn, hidden), "normal"
        yield q + "fc1.bias", (ffn,), "zeros"
        yield q + "fc2.weight", (hidden, ffn), "normal"
        yield q + "fc2.bias", (hidden,), "zeros"


def write_safetensors(path, specs, rng):
    header, offset = {}, 0
    for name, shape, _ in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, init in specs:
            if init == "normal":
                # In slices of at most 16M values: memory stays small for the largest shapes.
                total = int(np.prod(shape))
                for start in range(0, total, 1 << 24):
                    n = min(1 << 24, total - start)
                    f.write((rng.standard_normal(n, dtype=np.float32) * 0.02)
                            .astype("<f2").tobytes())
            else:
                arr = np.ones(shape, "<f2") if init == "ones" else np.zeros(shape, "<f2")
                f.write(arr.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--layers", type=int, help="override the layer count (smaller test models)")
    ap.add_argument("--vocab", type=int, default=50272)
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--tokenizer", type=pathlib.Path, default=ROOT / "models" / "opt-mini")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    hidden, layers, heads, ffn, proj, pre_ln = SHAPES[args.shape]
    layers = args.layers or layers
    args.out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_function": "relu",
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "ffn_dim": ffn, "word_embed_proj_dim": proj, "do_layer_norm_before": pre_ln,
        "vocab_size": args.vocab, "max_position_embeddings": args.max_positions,
        "enable_bias": True, "layer_norm_elementwise_affine": True, "dropout": 0.0,
        "attention_dropout": 0.0, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
        "tie_word_embeddings": True, "torch_dtype": "float16",
        "_deja_note": f"random weights, OPT-{args.shape} shape, seed {args.seed}",
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
        if (args.tokenizer / f).exists():
            shutil.copy(args.tokenizer / f, args.out / f)
    specs = list(tensor_specs(hidden, layers, ffn, proj, pre_ln, args.vocab, args.max_positions))
    write_safetensors(args.out / "model.safetensors", specs, np.random.default_rng(args.seed))
    print(f"wrote OPT-{args.shape}-shaped random checkpoint ({layers} layers) to {args.out}")


if __name__ == "__main__":
    main()
