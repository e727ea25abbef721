"""Write random Deja Vu predictors (predictors/predictors.h format) for a checkpoint, for speed
runs on random-weight models: their cost (reading the two maps, top-k) is that of trained
predictors of the same rank, while the units they pick are arbitrary. The schedule keeps
--mlp-keep of the neurons and --head-keep of the heads in every layer after --dense-layers.

    python3 tools/checkpoints/make_random_predictors.py --model build/models/opt-1.3b-random \\
        --rank 128 --mlp-keep 0.3 --head-keep 0.5 --out build/models/opt-1.3b-random/random-predictors.safetensors

Only numpy is needed (the safetensors writer of make_random_opt.py)."""
import argparse
import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_random_opt import write_safetensors  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, type=pathlib.Path, help="checkpoint dir (config.json)")
    ap.add_argument("--out", required=True, type=pathlib.Path, help="<stem>.safetensors")
    ap.add_argument("--rank", type=int, default=128, help="predictor rank r")
    ap.add_argument("--mlp-keep", type=float, default=0.3)
    ap.add_argument("--head-keep", type=float, default=0.5)
    ap.add_argument("--dense-layers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not (0 < a.mlp_keep <= 1 and 0 < a.head_keep <= 1 and a.rank > 0):
        sys.exit("--mlp-keep and --head-keep must be in (0, 1], --rank positive")
    cfg = json.loads((a.model / "config.json").read_text())
    d, ffn, heads, layers = (cfg["hidden_size"], cfg["ffn_dim"], cfg["num_attention_heads"],
                             cfg["num_hidden_layers"])
    specs, schedule = [], []
    for layer in range(layers):
        specs.append((f"mlp.{layer}.fc1", (a.rank, d), "normal"))
        specs.append((f"mlp.{layer}.fc2", (ffn, a.rank), "normal"))
        if layer >= 1:
            specs.append((f"heads.{layer}.fc1", (a.rank, d), "normal"))
            specs.append((f"heads.{layer}.fc2", (heads, a.rank), "normal"))
        dense = layer < a.dense_layers
        schedule.append({
            "layer": layer,
            "mlp": {"top_k": 0 if dense else max(1, round(a.mlp_keep * ffn))},
            "heads": {"top_k": 0 if dense or layer == 0 else max(1, round(a.head_keep * heads))},
        })
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(a.out, specs, np.random.default_rng(a.seed))
    meta = {"format": "deja-predictors-v1", "rank": a.rank, "hidden_size": d, "ffn_dim": ffn,
            "num_heads": heads, "num_layers": layers, "layers": schedule,
            "note": "random predictors for speed runs (tools/checkpoints/make_random_predictors.py)"}
    a.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {a.out} and {a.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
