#!/usr/bin/env python3
"""The OpenAI-compatible API of a real `deja serve` (TP 2, models/opt-mini), driven by the official
`openai` Python SDK (installed into .venv by scripts/install_deps.sh), by curl, and compared
with the gRPC API of the same server (grpcio, stubs compiled here from the public proto).

  sdk     completions and chat, whole and streamed (chunks join to the whole text; usage last),
          greedy text, tokens and log-probabilities equal to the gRPC API's for the same request,
          stop, n, seeds, penalties and logit_bias, deja's own options through extra_body, the
          errors (BadRequestError naming `param`, NotFoundError, RateLimitError), models,
          tokenize/detokenize, health, the `protocol` label of the metrics, and a client that
          closes its stream: the running count returns to 0;
  auth    `--auth-token-file`: AuthenticationError without the token, answers with it, /health
          open to probes;
  curl    `curl -N` shows the stream's events as they arrive, then `data: [DONE]`.

    openai_test.py --deja build/release/cli/deja --source . [sdk|auth|curl ...]
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, run_parts  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from openai_server import PROMPT, Server, make_pki  # noqa: E402

try:
    import openai
except ImportError:
    sys.exit("the openai package is missing: scripts/install_deps.sh installs it into .venv")

def client(server, **kw):
    """An OpenAI SDK client of `server`: no retries (a 429 is seen as it comes)."""
    kw.setdefault("api_key", "unused")
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 60)
    return openai.OpenAI(base_url=server.base + "/v1", **kw)


def grpc_stub(source, port):
    """deja.v1 stubs compiled from the public proto into a temporary directory."""
    import grpc
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="deja_openai_proto_")
    proto_dir = os.path.join(source, "proto")
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto_dir, "deja/v1/text_generation.proto")])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)
    from deja.v1 import text_generation_pb2 as pb, text_generation_pb2_grpc as rpc
    return pb, rpc.TextGenerationStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def test_sdk(source, deja):
    s = Server(deja, source, ["--max-queue", "4", "--max-batch-sequences", "2"])
    try:
        sdk_checks(s, source)
    finally:
        s.stop()


def sdk_checks(s, source):
    c = client(s)
    model = c.models.list().data[0].id
    check(model == "opt-mini", f"/v1/models lists the served model ({model})")
    check(c.models.retrieve(model).id == model, "/v1/models/<id> answers")
    try:
        c.models.retrieve("nope")
        check(False, "an unknown model id is NotFoundError")
    except openai.NotFoundError:
        check(True, "an unknown model id is NotFoundError")

    # Greedy completion equals the gRPC API's: text, token ids and log-probabilities.
    pb, stub = grpc_stub(source, s.grpc_port)
    g = stub.Generate(pb.GenerateRequest(
        text=PROMPT, stopping=pb.StoppingCriteria(max_new_tokens=24),
        response=pb.ResponseOptions(logprobs=True, top_n_tokens=2)), timeout=60)
    r = c.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                             logprobs=2)
    ch = r.choices[0]
    check(ch.text == g.text, f"greedy completion equals gRPC's text ({ch.text!r})")
    lp = ch.logprobs
    check(lp.tokens == [t.text for t in g.tokens], "logprobs.tokens equal gRPC's tokens")
    check(max(abs(a - t.logprob) for a, t in zip(lp.token_logprobs, g.tokens)) < 1e-6,
          "token_logprobs equal gRPC's log-probabilities")
    check(all(len(t) <= 2 and len(t) >= 1 for t in lp.top_logprobs), "top_logprobs has 2 each")
    check(all(list(t.values()) == sorted(t.values(), reverse=True) for t in lp.top_logprobs),
          "top_logprobs most likely first")
    # Sampled: the chosen token is always among its top_logprobs (up to logprobs + 1 entries).
    rs = c.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=1.5, seed=3,
                              logprobs=1)
    ls = rs.choices[0].logprobs
    check(all(tok in top and 1 <= len(top) <= 2 for tok, top in zip(ls.tokens, ls.top_logprobs)),
          "a sampled token is in its top_logprobs")
    # Streamed, the same tokens at the same text_offset.
    st = list(c.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                   logprobs=2, stream=True))
    offsets = [o for x in st if x.choices and x.choices[0].logprobs
               for o in x.choices[0].logprobs.text_offset]
    check(offsets == lp.text_offset, f"streamed text_offset equal ({offsets} vs {lp.text_offset})")
    check(r.usage.prompt_tokens == g.prompt_tokens and r.usage.completion_tokens == 24 and
          r.usage.total_tokens == g.prompt_tokens + 24, f"usage counts ({r.usage})")
    check(ch.finish_reason == "length", "finish_reason length at max_tokens")

    # Streaming joins to the same text; usage comes last with include_usage.
    chunks = list(c.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    text = "".join(x.choices[0].text for x in chunks if x.choices)
    check(text == g.text, "streamed chunks join to the whole text")
    check(len([x for x in chunks if x.choices]) > 3, f"the stream came in pieces ({len(chunks)})")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24,
          "the last chunk carries the usage")
    finals = [x.choices[0].finish_reason for x in chunks if x.choices and x.choices[0].finish_reason]
    check(finals == ["length"], f"one finish_reason in the stream ({finals})")

    # Token-id prompts, several prompts, echo.
    ids = c.post("/../tokenize", body={"prompt": PROMPT}, cast_to=object)["tokens"]
    r2 = c.completions.create(model=model, prompt=ids, max_tokens=24, temperature=0)
    check(r2.choices[0].text == g.text, "a token-id prompt (BOS included) gives the same text")
    back = c.post("/../detokenize", body={"tokens": ids[1:]}, cast_to=object)["prompt"]
    check(back == PROMPT, "detokenize inverts tokenize")
    r3 = c.completions.create(model=model, prompt=[PROMPT, "Hello"], max_tokens=4, temperature=0,
                              echo=True)
    check(len(r3.choices) == 2 and r3.choices[0].text.startswith(PROMPT) and
          r3.choices[1].text.startswith("Hello"), "two prompts, echoed, two choices")

    # Stop sequences end the text before them.
    word = g.text.split()[2] if len(g.text.split()) > 2 else g.text[:3]
    r4 = c.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0, stop=word)
    check(r4.choices[0].finish_reason == "stop" and word not in r4.choices[0].text and
          g.text.startswith(r4.choices[0].text), f"stop={word!r} ends the text before it")

    # Sampling: n choices; the same seed gives the same choices.
    a = c.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, n=3,
                             seed=7)
    b = c.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, n=3,
                             seed=7)
    check([x.text for x in a.choices] == [x.text for x in b.choices] and len(a.choices) == 3,
          "n=3 with a seed: three choices, reproducible")
    check(len({x.text for x in a.choices}) > 1, "the n choices differ")
    check(a.usage.prompt_tokens == g.prompt_tokens, "a prompt counts once in usage with n > 1")

    # logit_bias forces a token; a frequency penalty changes a repetitive greedy text.
    forced = ids[1]
    r5 = c.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0,
                              logit_bias={str(forced): 100}, logprobs=0)
    got = c.post("/../tokenize", body={"prompt": r5.choices[0].text, "add_special_tokens": False},
                 cast_to=object)["tokens"]
    check(got == [forced] * 6, f"logit_bias +100 forces token {forced} ({got})")
    long_g = c.completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0)
    pen = c.completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0,
                               frequency_penalty=2.0, presence_penalty=2.0)
    check(pen.choices[0].text != long_g.choices[0].text, "penalties change the greedy text")

    # Chat: the default template; the same text as a completion of the rendered prompt.
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Who said let there be light?"}]
    chat = c.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0,
                                     logprobs=True, top_logprobs=2)
    rendered = "You are terse.\n\nUser: Who said let there be light?\nAssistant:"
    comp = c.completions.create(model=model, prompt=rendered, max_tokens=16, temperature=0,
                                stop=["\nUser:"])
    check(chat.choices[0].message.content == comp.choices[0].text,
          "chat equals a completion of the template's prompt")
    check(chat.choices[0].message.role == "assistant", "chat message role is assistant")
    lc = chat.choices[0].logprobs.content
    check(len(lc) >= 1 and all(len(t.top_logprobs) == 2 and t.bytes is not None for t in lc),
          "chat logprobs carry tokens, bytes and 2 top_logprobs")
    stream = c.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0,
                                       stream=True)
    parts = list(stream)
    check(parts[0].choices[0].delta.role == "assistant", "the first chat chunk carries the role")
    check("".join(p.choices[0].delta.content or "" for p in parts) ==
          chat.choices[0].message.content, "streamed chat joins to the whole message")

    # deja's own options through extra_body, named as in deja.v1.
    h2o = c.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                               extra_body={"cache": {"kind": "KIND_H2O", "heavy_ratio": 0.5,
                                                     "recent_ratio": 0.5},
                                           "prefix_cache": {"mode": "MODE_OFF"},
                                           "cache_salt": "tenant-a", "top_k": 5})
    check(len(h2o.choices[0].text) > 0, "extra_body cache/prefix_cache/cache_salt/top_k accepted")

    # Errors: 400 naming the parameter, 404 for the model, 429 when the queue is full.
    def bad(param, **kw):
        kw.setdefault("max_tokens", 4)
        kw.setdefault("prompt", PROMPT)
        try:
            c.completions.create(model=model, **kw)
            check(False, f"BadRequestError naming {param}")
        except openai.BadRequestError as e:
            body = e.body or {}
            check(e.status_code == 400 and body.get("param") == param and param in body.get(
                "message", ""), f"BadRequestError naming {param} ({body.get('message')})")
    bad("temperature", temperature=5)
    bad("max_tokens", max_tokens=0)
    bad("max_tokens", max_tokens=5000)
    bad("top_p", top_p=1.5)
    bad("logprobs", logprobs=9)
    bad("presence_penalty", presence_penalty=3)
    bad("logit_bias", logit_bias={"99999999": 1})
    bad("stop", stop=["a", "b", "c", "d", "e"])
    bad("prompt", prompt="")
    bad("cache.heavy_tokens", extra_body={"cache": {"kind": "KIND_H2O", "heavy_tokens": 1,
                                            "heavy_ratio": 0.1}})
    bad("cache", extra_body={"cache": {"kind": "KIND_NOPE"}})
    bad("frobnicate", extra_body={"frobnicate": 1})
    try:
        c.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)
        check(False, "an unknown model is NotFoundError")
    except openai.NotFoundError as e:
        check(e.body.get("code") == "model_not_found", "an unknown model is NotFoundError")
    try:
        c.chat.completions.create(model=model, messages=[{"role": "robot", "content": "x"}])
        check(False, "a bad chat role is BadRequestError")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "messages[0].role", f"a bad role names messages[0].role")

    # A client that closes its stream: its sequence leaves the batch (running returns to 0).
    before = s.series("deja_coordinator_requests_total", 'code="CANCELLED",protocol="openai"')
    st = c.completions.create(model=model, prompt=PROMPT, max_tokens=400, temperature=0,
                              stream=True, extra_body={"ignore_eos": True})
    got = 0
    for _ in st:
        got += 1
        if got == 3:
            break
    running = s.series("deja_coordinator_running_requests")
    check(running == 1, f"the stream's sequence runs ({running})")
    st.close()
    t0 = time.monotonic()
    while time.monotonic() < t0 + 5 and s.series("deja_coordinator_running_requests") > 0:
        time.sleep(0.02)
    check(s.series("deja_coordinator_running_requests") == 0,
          f"closing the stream cancels its sequence (in {time.monotonic() - t0:.2f} s)")
    after = s.series("deja_coordinator_requests_total", 'code="CANCELLED",protocol="openai"')
    check(after == before + 1, f"the cancel is counted as CANCELLED, protocol openai ({after})")

    # The batch holds 2 (--max-batch-sequences 2) and the queue 4: a seventh request is 429.
    streams = [c.completions.create(model=model, prompt=PROMPT, max_tokens=400, stream=True,
                                    extra_body={"ignore_eos": True}) for _ in range(2)]
    for x in streams:
        next(iter(x))
    streams += [c.completions.create(model=model, prompt=PROMPT, max_tokens=400, stream=True,
                                     extra_body={"ignore_eos": True}) for _ in range(4)]
    try:
        c.completions.create(model=model, prompt=PROMPT, max_tokens=4)
        check(False, "a full server answers RateLimitError (429)")
    except openai.RateLimitError:
        check(True, "a full server answers RateLimitError (429)")
    for x in streams:
        x.close()

    ok_openai = s.series("deja_coordinator_requests_total", 'code="OK",protocol="openai"')
    ok_grpc = s.series("deja_coordinator_requests_total", 'code="OK",protocol="grpc"')
    check(ok_openai >= 15 and ok_grpc == 1,
          f"requests_total counts by protocol (openai {ok_openai}, grpc {ok_grpc})")
    rejected = s.series("deja_coordinator_rejections_total",
                        'reason="invalid_argument",protocol="openai"')
    check(rejected >= 10, f"rejections_total counts the OpenAI refusals ({rejected})")
    with urllib.request.urlopen(s.base + "/health") as h:
        check(h.status == 200, "/health is 200 while ready")
    # A body over the limit (8 MiB): 413 as an OpenAI error object; the server goes on.
    big = urllib.request.Request(s.base + "/v1/completions", method="POST",
                                 data=b'{"prompt": "' + b"a" * (9 << 20) + b'"}',
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(big)
        check(False, "a 9 MiB body is 413")
    except urllib.error.HTTPError as e:
        err = json.loads(e.read()).get("error", {})
        check(e.code == 413 and "too large" in err.get("message", ""),
              f"a 9 MiB body is 413 with an OpenAI error ({e.code} {err})")
    except OSError as e:  # the server may close before the client has sent it all
        check(False, f"a 9 MiB body is 413 ({e})")
    check(c.models.list().data[0].id == model, "the server goes on after it")


def test_auth(source, deja):
    """Bearer tokens and TLS from the same flags as the gRPC API's."""
    import ssl
    d = tempfile.mkdtemp(prefix="deja_openai_pki_")
    make_pki(d)
    with open(os.path.join(d, "tokens"), "w") as f:
        f.write("sesame\n")
    s = Server(deja, source, ["--auth-token-file", os.path.join(d, "tokens"),
                              "--tls-cert", os.path.join(d, "server.pem"),
                              "--tls-key", os.path.join(d, "server.key")], name="auth")
    s.base = s.base.replace("http://", "https://")
    ca = os.path.join(d, "ca.pem")
    try:
        def tls_client(key):
            return client(s, api_key=key, http_client=openai.DefaultHttpxClient(verify=ca))
        try:
            tls_client("wrong").completions.create(model="opt-mini", prompt=PROMPT, max_tokens=2)
            check(False, "a wrong token is AuthenticationError")
        except openai.AuthenticationError:
            check(True, "a wrong token is AuthenticationError")
        r = tls_client("sesame").completions.create(model="opt-mini", prompt=PROMPT, max_tokens=2,
                                                temperature=0)
        check(r.usage.completion_tokens == 2, "the right token is served, over TLS")
        chunks = list(tls_client("sesame").chat.completions.create(
            model="opt-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            stream=True))
        check(len(chunks) >= 2, f"a stream over TLS ({len(chunks)} chunks)")
        try:
            client(s, api_key="sesame").completions.create(model="opt-mini", prompt=PROMPT,
                                                          max_tokens=2)
            check(False, "a client that does not trust the CA fails")
        except openai.APIConnectionError:
            check(True, "a client that does not trust the CA fails")
        with urllib.request.urlopen(s.base + "/health",
                                    context=ssl.create_default_context(cafile=ca)) as h:
            check(h.status == 200, "/health needs no token (probes)")
        n = s.series("deja_coordinator_rejections_total",
                     'reason="unauthenticated",protocol="openai"')
        check(n == 1, f"the refusal is counted as unauthenticated, protocol openai ({n})")
    finally:
        s.stop()


def test_curl(source, deja):
    s = Server(deja, source, name="curl")
    try:
        # One request first, so the streamed one's first token carries no start-up cost (the
        # weights' pages, the first allocations).
        warm = json.dumps({"prompt": PROMPT, "max_tokens": 1}).encode()
        urllib.request.urlopen(urllib.request.Request(
            s.base + "/v1/completions", data=warm,
            headers={"Content-Type": "application/json"})).read()
        body = json.dumps({"prompt": PROMPT, "max_tokens": 600, "temperature": 0, "stream": True,
                           "ignore_eos": True})
        p = subprocess.Popen(["curl", "-sN", s.base + "/v1/completions", "-H",
                              "Content-Type: application/json", "-d", body],
                             stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        lines, arrived = [], []
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            arrived.append(time.monotonic() - t0)
        p.wait()
        events = [i for i, l in enumerate(lines) if l.startswith("data: ")]
        check(bool(events) and lines[0].startswith("data: {"), "curl -N reads a data: event first")
        check(bool(events) and lines[events[-1]] == "data: [DONE]",
              "the stream ends with data: [DONE]")
        check(len(events) > 300, f"one event per token or so ({len(events)})")
        # A buffered reply arrives all at once at the end; a stream spreads over the generation.
        # Most of the generation lies between the first event and the last however slow the
        # host, unless the first token alone took most of it.
        if events:
            first, last = arrived[events[0]], arrived[events[-1]]
            check(last - first > 0.5 * last,
                  f"the events arrived as generated: the first at {first:.3f} s, the last at "
                  f"{last:.3f} s")
    finally:
        s.stop()

if __name__ == "__main__":
    run_parts({"sdk": test_sdk, "auth": test_auth, "curl": test_curl})
