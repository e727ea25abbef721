#!/usr/bin/env python3
"""A short client for deja's public gRPC API (deja.v1.TextGeneration).

Generate the Python modules first (see examples/README.md), then for example:
  python examples/python_client.py --target localhost:50051 generate "Hello, my name is"
  python examples/python_client.py --target localhost:50051 stream "Once upon a time" --max-new-tokens 40
  python examples/python_client.py --target localhost:50051 generate "Hello" --sparsity on
  python examples/python_client.py --target localhost:50051 tokenize "Hello world"
  python examples/python_client.py --target localhost:50051 info
A server with TLS and bearer tokens (docs/serving.md#security):
  python examples/python_client.py --target deja.example:50051 --tls-ca ca.pem \
      --auth-token-file token.txt generate "Hello"
"""
import argparse
import os
import sys

import grpc

# The generated modules live in --gen-dir (default: examples/gen next to this file).
_DEFAULT_GEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen")


def _import_api(gen_dir):
    sys.path.insert(0, gen_dir)
    try:
        from deja.v1 import text_generation_pb2 as pb
        from deja.v1 import text_generation_pb2_grpc as pb_grpc
    except ImportError as e:
        sys.exit(f"cannot import the generated deja.v1 modules from {gen_dir} ({e}); "
                 "run the protoc command in examples/README.md first")
    return pb, pb_grpc


def _build_request(pb, args):
    req = pb.GenerateRequest(text=args.prompt)
    if args.request_id:
        req.request_id = args.request_id
    if args.max_new_tokens is not None:
        req.stopping.max_new_tokens = args.max_new_tokens
    req.stopping.stop_sequences.extend(args.stop or [])
    if args.temperature is not None:
        req.sampling.do_sample = args.temperature > 0
        req.sampling.temperature = args.temperature
    if args.top_p is not None:
        req.sampling.top_p = args.top_p
    if args.seed is not None:
        req.sampling.seed = args.seed
    if args.logprobs:
        req.response.logprobs = True
    # KV-cache policy: unset uses the server's default (ModelInfo.default_cache_policy); budgets
    # left unset come from that default when the kinds match, else 10% of the prompt.
    if args.cache:
        req.cache.kind = pb.CachePolicy.Kind.Value("KIND_" + args.cache.upper())
    if args.heavy_tokens is not None:
        req.cache.heavy_tokens = args.heavy_tokens
    if args.recent_tokens is not None:
        req.cache.recent_tokens = args.recent_tokens
    # Deja Vu sparsity: unset uses the server's default (ModelInfo.sparsity_available says
    # whether MODE_ON is accepted; FAILED_PRECONDITION otherwise).
    if args.sparsity:
        req.sparsity.mode = pb.Sparsity.Mode.Value("MODE_" + args.sparsity.upper())
    if args.sparsity_schedule:
        req.sparsity.schedule = args.sparsity_schedule
    return req


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _token(args):
    """The bearer token: the first token of --auth-token-file, else $DEJA_AUTH_TOKEN, else None."""
    if args.auth_token_file:
        with open(args.auth_token_file, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    return line
        sys.exit(f"--auth-token-file: {args.auth_token_file} holds no token")
    return os.environ.get("DEJA_AUTH_TOKEN", "").strip() or None


def _channel(args):
    """A plaintext channel, or TLS when --tls, --tls-ca or --tls-cert is given."""
    if bool(args.tls_cert) != bool(args.tls_key):
        sys.exit("--tls-cert and --tls-key go together")
    if not (args.tls or args.tls_ca or args.tls_cert):
        if args.tls_server_name:
            sys.exit("--tls-server-name needs TLS (--tls-ca, or --tls for the system's CAs)")
        return grpc.insecure_channel(args.target)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(args.tls_ca) if args.tls_ca else None,
        private_key=_read(args.tls_key) if args.tls_key else None,
        certificate_chain=_read(args.tls_cert) if args.tls_cert else None)
    options = []
    if args.tls_server_name:
        options.append(("grpc.ssl_target_name_override", args.tls_server_name))
    return grpc.secure_channel(args.target, credentials, options=options)


def _finish(pb, reason):
    return pb.FinishReason.Name(reason).removeprefix("FINISH_REASON_").lower()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="localhost:50051", help="coordinator host:port")
    parser.add_argument("--gen-dir", default=_DEFAULT_GEN_DIR, help="generated modules")
    parser.add_argument("--timeout", type=float, default=60.0, help="deadline in seconds")
    parser.add_argument("--tls", action="store_true",
                        help="TLS, trusting the system's CA certificates")
    parser.add_argument("--tls-ca", help="PEM CA certificates of the server (implies TLS)")
    parser.add_argument("--tls-cert", help="PEM client certificate for mutual TLS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-server-name",
                        help="name to check the server's certificate against (default: the host)")
    parser.add_argument("--auth-token-file",
                        help="file whose first token is sent as 'authorization: Bearer <token>' "
                             "(default: $DEJA_AUTH_TOKEN)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("generate", "stream"):
        p = sub.add_parser(name)
        p.add_argument("prompt")
        p.add_argument("--max-new-tokens", type=int)
        p.add_argument("--temperature", type=float, help="> 0 samples; unset = greedy")
        p.add_argument("--top-p", type=float)
        p.add_argument("--seed", type=int)
        p.add_argument("--stop", action="append", help="stop sequence (up to 4)")
        p.add_argument("--logprobs", action="store_true")
        p.add_argument("--cache", choices=["full", "window", "h2o"])
        p.add_argument("--heavy-tokens", type=int, help="h2o heavy-hitter budget per head")
        p.add_argument("--recent-tokens", type=int, help="recent-token budget per head")
        p.add_argument("--sparsity", choices=["on", "off"],
                       help="Deja Vu contextual sparsity; unset = the server's default")
        p.add_argument("--sparsity-schedule",
                       help="one of ModelInfo.sparsity_schedules (implies --sparsity on)")
        p.add_argument("--request-id")
    sub.add_parser("tokenize").add_argument("text")
    sub.add_parser("info")
    args = parser.parse_args()

    pb, pb_grpc = _import_api(args.gen_dir)
    token = _token(args)
    # Every call carries the token (when there is one) and the deadline.
    call = {"timeout": args.timeout,
            "metadata": [("authorization", f"Bearer {token}")] if token else None}
    with _channel(args) as channel:
        stub = pb_grpc.TextGenerationStub(channel)
        try:
            if args.command == "generate":
                resp = stub.Generate(_build_request(pb, args), **call)
                print(resp.text)
                print(f"[{resp.request_id}] {resp.prompt_tokens} prompt + "
                      f"{resp.generated_tokens} generated tokens, "
                      f"finish={_finish(pb, resp.finish_reason)}, "
                      f"total={resp.timings.total_ms:.1f} ms", file=sys.stderr)
                for t in resp.tokens:
                    print(f"  {t.id:6d} {t.logprob:9.4f} {t.text!r}", file=sys.stderr)
            elif args.command == "stream":
                for msg in stub.GenerateStream(_build_request(pb, args), **call):
                    print(msg.text_delta, end="", flush=True)
                    if msg.finished:
                        print()
                        print(f"[{msg.request_id}] {msg.generated_tokens} tokens, "
                              f"finish={_finish(pb, msg.finish_reason)}, ttft="
                              f"{msg.timings.time_to_first_token_ms:.1f} ms", file=sys.stderr)
            elif args.command == "tokenize":
                resp = stub.Tokenize(pb.TokenizeRequest(text=args.text), **call)
                for i, t in zip(resp.ids, resp.tokens):
                    print(f"{i}\t{t!r}")
            elif args.command == "info":
                print(stub.GetModelInfo(pb.GetModelInfoRequest(), **call), end="")
        except grpc.RpcError as e:
            sys.exit(f"error: {e.code().name}: {e.details()}")


if __name__ == "__main__":
    main()
