"""Helper of bench/peer_ctranslate2.sh for OpenVINO (through optimum-intel): exports an OPT
checkpoint with int8 or int4 weights, and times OpenVINO the way `deja bench decode` times deja.

    python3 bench/peer_openvino.py info
    python3 bench/peer_openvino.py export --model DIR --out DIR --weights int8|int4
    python3 bench/peer_openvino.py run --model OV_DIR --threads 2 ...

OpenVINO is only a measuring stick here; nothing in deja imports it. It runs in its own venv
(bench/peer_ctranslate2.sh makes it). Its defaults are kept but for the thread count: the runtime
picks the inference precision and the KV-cache precision itself, and `run` reports both."""
import argparse
import json
import pathlib
import statistics
import sys
import time

# int4 as OpenVINO's own int4 presets for LLMs: symmetric, groups of 128 weights, every layer
# (ratio 1.0: no layer kept in int8 by the mixed-precision search, so the figure is int4's).
WEIGHTS = {
    "int8": dict(bits=8),
    "int4": dict(bits=4, sym=True, group_size=128, ratio=1.0),
}


def cmd_info(args):
    import openvino
    import optimum.intel

    core = openvino.Core()
    print(json.dumps({
        "openvino": openvino.__version__,
        "optimum_intel": getattr(optimum.intel, "__version__", "unknown"),
        "cpu": core.get_property("CPU", "FULL_DEVICE_NAME"),
        "cpu_capabilities": list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
    }))


def cmd_export(args):
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig

    q = OVWeightQuantizationConfig(**WEIGHTS[args.weights])
    t0 = time.time()
    model = OVModelForCausalLM.from_pretrained(str(args.model), export=True, compile=False,
                                               quantization_config=q, use_cache=True)
    model.save_pretrained(str(args.out))
    print(f"exported {args.model} with {args.weights} weights to {args.out} in "
          f"{time.time() - t0:.0f} s", file=sys.stderr)


def load(model_dir, threads):
    from optimum.intel import OVModelForCausalLM

    cfg = {"INFERENCE_NUM_THREADS": str(threads), "NUM_STREAMS": "1",
           "PERFORMANCE_HINT": "LATENCY"}
    return OVModelForCausalLM.from_pretrained(str(model_dir), ov_config=cfg, compile=True)


def precisions(model):
    """What the runtime chose: the inference precision and the KV cache's."""
    out = {}
    compiled = model.request.get_compiled_model() if hasattr(model.request, "get_compiled_model") \
        else getattr(model, "compiled_model", None)
    for key, name in (("INFERENCE_PRECISION_HINT", "inference_precision"),
                      ("KV_CACHE_PRECISION", "kv_cache_precision")):
        try:
            v = compiled.get_property(key)
            out[name] = v.get_type_name() if hasattr(v, "get_type_name") else str(v)
        except Exception as e:  # an older runtime without the property
            out[name] = f"unknown ({type(e).__name__})"
    return out


class Stamps:
    """A logits processor that records when each step's logits arrive (the forward is done)."""

    def __init__(self):
        self.t = []

    def __call__(self, input_ids, scores):
        self.t.append(time.perf_counter())
        return scores


def cmd_run(args):
    """One OpenVINO run with `deja bench decode`'s measurements, one JSON line on stdout:

    - prefill: a `prefill_tokens`-token prompt through generate(max_new_tokens=1): the prompt
      forwarded at once, then one greedy token (time to first token, as deja's prefill). Best
      of 3, as deja.
    - decode: `batch` prompts of `prompt_tokens` random tokens, `decode_steps` + 1 greedy tokens
      (min_new_tokens forces them); the step time is the gap between consecutive logits (a
      logits processor's timestamps), the median over the steps, as deja's median step time.
      One untimed warm-up generation per batch size first, as deja's --warmup-rounds 1."""
    import random

    import openvino
    import torch
    from transformers import LogitsProcessorList

    t0 = time.time()
    model = load(args.model, args.threads)
    load_s = time.time() - t0
    vocab = model.config.vocab_size
    rng = random.Random(1)

    def prompts(b, n):
        # Random ids >= 4, as deja draws them (below are <s>, <pad>, </s>, <unk>).
        return torch.tensor([[rng.randrange(4, vocab) for _ in range(n)] for _ in range(b)])

    def generate(ids, new, stamps=None):
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1,
                  attention_mask=torch.ones_like(ids), pad_token_id=1)
        if stamps is not None:
            kw["logits_processor"] = LogitsProcessorList([stamps])
        return model.generate(ids, **kw)

    j = {"engine": "openvino", "openvino": openvino.__version__, "model": str(args.model),
         "weights": args.weights, "threads": args.threads, "load_s": load_s}
    j.update(precisions(model))
    best = 1e30
    for _ in range(3):
        ids = prompts(1, args.prefill_tokens)
        t = time.perf_counter()
        out = generate(ids, 1)
        best = min(best, time.perf_counter() - t)
        assert out.shape[1] == args.prefill_tokens + 1
    j["prefill_tokens"] = args.prefill_tokens
    j["prefill_tokens_per_s"] = args.prefill_tokens / best
    j["decode"] = []
    for b in [int(x) for x in args.batches.split(",")]:
        for timed in (False, True):
            stamps = Stamps()
            ids = prompts(b, args.prompt_tokens)
            t = time.perf_counter()
            out = generate(ids, args.decode_steps + 1, stamps)
            total = time.perf_counter() - t
        if out.shape[1] != args.prompt_tokens + args.decode_steps + 1 or \
                len(stamps.t) != args.decode_steps + 1:
            raise SystemExit(f"openvino generated {out.shape[1] - args.prompt_tokens} tokens, "
                             f"{len(stamps.t)} steps; wanted {args.decode_steps + 1}")
        steps = [b2 - a for a, b2 in zip(stamps.t, stamps.t[1:])]
        ms = statistics.median(steps) * 1e3
        j["decode"].append({"batch": b, "ms_per_step": ms, "tokens_per_s": b / ms * 1e3,
                            "mean_ms_per_step": (stamps.t[-1] - stamps.t[0]) /
                            (len(stamps.t) - 1) * 1e3,
                            "first_token_ms": (stamps.t[0] - t) * 1e3, "generate_s": total})
        print(f"openvino {args.weights} decode batch {b:3d}: {ms:8.3f} ms/step", file=sys.stderr)
    print(json.dumps(j))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info")
    e = sub.add_parser("export")
    e.add_argument("--model", required=True, type=pathlib.Path)
    e.add_argument("--out", required=True, type=pathlib.Path)
    e.add_argument("--weights", choices=sorted(WEIGHTS), default="int8")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, type=pathlib.Path)
    r.add_argument("--weights", default="int8", help="a label for the report")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--prefill-tokens", type=int, default=512)
    r.add_argument("--prompt-tokens", type=int, default=64)
    r.add_argument("--decode-steps", type=int, default=64)
    r.add_argument("--batches", default="1,16")
    args = ap.parse_args()
    {"info": cmd_info, "export": cmd_export, "run": cmd_run}[args.cmd](args)


if __name__ == "__main__":
    main()
