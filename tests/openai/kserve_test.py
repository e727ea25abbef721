#!/usr/bin/env python3
"""KServe v2 (Open Inference Protocol) on the gRPC port of a real `deja serve` (TP 2,
models/opt-mini), driven by `tritonclient[grpc]` (installed into .venv-triton by
scripts/install_deps.sh): liveness, readiness, server and model metadata, ModelInfer with greedy
text equal to the OpenAI API's for the same request, ModelStreamInfer streaming pieces that join
to the whole text (the last flagged final) and several requests on one stream, errors (unknown
model, bad input, a stream error that leaves the stream open), and the `protocol` label.

    kserve_test.py --deja build/release/cli/deja --source . kserve
"""
import json
import os
import queue
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, run_parts  # noqa: E402

try:
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException
except ImportError:
    sys.exit("tritonclient is missing: scripts/install_deps.sh installs it into .venv-triton")

from openai_server import PROMPT, Server  # noqa: E402

MODEL = "opt-mini"


def inputs(prompt, max_tokens, stream=False, temperature=0.0, **extra):
    def tensor(name, arr, dtype):
        t = tc.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t
    out = [tensor("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
           tensor("max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"),
           tensor("temperature", np.array([temperature], dtype=np.float32), "FP32"),
           tensor("stream", np.array([stream], dtype=bool), "BOOL"),
           tensor("exclude_input_in_output", np.array([True], dtype=bool), "BOOL"),
           tensor("return_num_output_tokens", np.array([True], dtype=bool), "BOOL")]
    for name, (arr, dtype) in extra.items():
        out.append(tensor(name, arr, dtype))
    return out


def openai_text(s, prompt, max_tokens):
    req = urllib.request.Request(
        s.base + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode())
    with urllib.request.urlopen(req) as r:
        return json.load(r)["choices"][0]["text"]


def test_kserve(source, deja):
    s = Server(deja, source, name="kserve")
    try:
        kserve_checks(s)
    finally:
        s.stop()


def kserve_checks(s):
    c = tc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
    check(c.is_server_live(), "ServerLive")
    check(c.is_server_ready(), "ServerReady")
    check(c.is_model_ready(MODEL), "ModelReady")
    try:
        c.is_model_ready("nope")
        check(False, "ModelReady of an unknown model is NOT_FOUND")
    except InferenceServerException as e:
        check("NOT_FOUND" in str(e.status()), f"ModelReady of an unknown model is NOT_FOUND ({e})")
    meta = c.get_server_metadata()
    check(meta.name == "deja", f"ServerMetadata names deja ({meta.name} {meta.version})")
    mm = c.get_model_metadata(MODEL)
    names = {t.name for t in mm.inputs}
    check({"text_input", "max_tokens", "stream", "temperature"} <= names and
          mm.outputs[0].name == "text_output", "ModelMetadata lists the tensors")

    # ModelInfer: greedy text equals the OpenAI API's.
    want = openai_text(s, PROMPT, 24)
    r = c.infer(MODEL, inputs(PROMPT, 24), request_id="k-1")
    text = r.as_numpy("text_output")[0].decode()
    check(text == want, f"ModelInfer's greedy text equals the OpenAI API's ({text!r})")
    check(int(r.as_numpy("num_output_tokens")[0]) == 24, "num_output_tokens is 24")
    check(r.get_response().id == "k-1", "the response carries the request id")

    # ModelStreamInfer: pieces join to the same text; two requests on one stream.
    got = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    c.async_stream_infer(MODEL, inputs(PROMPT, 24, stream=True), request_id="s-1")
    c.async_stream_infer(MODEL, inputs("Hello", 8, stream=False), request_id="s-2")
    c.async_stream_infer("nope", inputs("Hello", 8), request_id="s-3")
    pieces, finals, whole, errors = [], 0, None, []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (finals < 1 or whole is None or not errors):
        try:
            result, error = got.get(timeout=5)
        except queue.Empty:
            break
        if error is not None:
            errors.append(str(error))
            continue
        resp = result.get_response()
        final = resp.parameters["triton_final_response"].bool_param
        if resp.id == "s-1":
            pieces.append(result.as_numpy("text_output")[0].decode())
            finals += final
        elif resp.id == "s-2":
            whole = result.as_numpy("text_output")[0].decode()
    c.stop_stream()
    check("".join(pieces) == want and len(pieces) > 3,
          f"streamed pieces join to the whole text ({len(pieces)} pieces)")
    check(finals == 1, "exactly the last piece is flagged triton_final_response")
    check(whole == openai_text(s, "Hello", 8), "a non-streaming request on the stream is whole")
    check(len(errors) == 1 and "nope" in errors[0],
          f"an unknown model fails its request only ({errors})")

    # Bad input: INVALID_ARGUMENT naming it.
    try:
        c.infer(MODEL, inputs(PROMPT, 0))
        check(False, "max_tokens 0 is INVALID_ARGUMENT")
    except InferenceServerException as e:
        check("INVALID_ARGUMENT" in str(e.status()) and "max_tokens" in e.message(),
              f"max_tokens 0 is INVALID_ARGUMENT naming it ({e.message()})")
    try:
        c.infer(MODEL, inputs(PROMPT, 4, bogus=(np.array([1], dtype=np.int32), "INT32")))
        check(False, "an unknown input is INVALID_ARGUMENT")
    except InferenceServerException as e:
        check("bogus" in e.message(), f"an unknown input is named ({e.message()})")
    n = s.series("deja_coordinator_requests_total", 'code="OK",protocol="kserve"')
    check(n == 3, f"requests_total counts the KServe requests (protocol kserve: {n})")


if __name__ == "__main__":
    run_parts({"kserve": test_kserve})
