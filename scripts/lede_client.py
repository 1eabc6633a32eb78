#!/usr/bin/python3
"""A Python client of LEDE's public API (lede.v1.Generation/Generate).

Streams a generation and prints the text as it arrives, then the summary.
Stubs are generated from proto/ with protoc and grpc_python_plugin (Debian's
protobuf-compiler-grpc) into build/python on first use.

usage: scripts/lede_client.py [--target 127.0.0.1:50051] [--method lede|static|threshold|autoregressive]
                              [--max-new-tokens 64] [--temperature 0] [--seed 0]
                              [--exit-layer 3 --draft-length 3] [--threshold 0.6] [--json]
                              [--tls-ca ca.pem] [--api-key KEY (or $LEDE_API_KEY)] PROMPT
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_stubs(out_dir=None):
    out_dir = out_dir or os.environ.get("LEDE_PY_STUBS", os.path.join(ROOT, "build", "python"))
    gen = os.path.join(out_dir, "proto", "lede", "v1", "generation_pb2_grpc.py")
    if not os.path.exists(gen):
        os.makedirs(out_dir, exist_ok=True)
        protos = [os.path.join("proto", "lede", "v1", n) for n in
                  ("experience.proto", "generation.proto", "model.proto", "policy.proto")]
        subprocess.run(["protoc", "-I", ROOT, "--python_out=" + out_dir, "--grpc_out=" + out_dir,
                        "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos,
                       check=True, cwd=ROOT)
    sys.path.insert(0, out_dir)
    from proto.lede.v1 import generation_pb2, generation_pb2_grpc  # noqa: E402
    return generation_pb2, generation_pb2_grpc


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--method", default="lede", choices=["lede", "static", "threshold", "autoregressive"])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exit-layer", type=int, default=0)
    p.add_argument("--draft-length", type=int, default=0)
    p.add_argument("--threshold", type=float, default=0.0)
    p.add_argument("--epsilon", type=float, default=0.0)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--request-id", default="")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", action="store_true", help="print one JSON object (text, token ids, summary)")
    p.add_argument("--ids-out", default="", help="also write the generated token ids here (one line, space-separated)")
    p.add_argument("--tls-ca", default="", help="CA (PEM) of the coordinator's --tls-cert: connect with TLS")
    p.add_argument("--api-key", default=os.environ.get("LEDE_API_KEY", ""),
                   help="API key sent as 'authorization: Bearer KEY' (default $LEDE_API_KEY)")
    a = p.parse_args()

    import grpc
    pb, pb_grpc = load_stubs()
    method = getattr(pb, "SPECULATION_METHOD_" + a.method.upper())
    req = pb.GenerateRequest(
        request_id=a.request_id, prompt=a.prompt, max_new_tokens=a.max_new_tokens,
        temperature=a.temperature, top_p=a.top_p, seed=a.seed, stop=a.stop, method=method,
        speculation=pb.SpeculationParams(exit_layer=a.exit_layer, draft_length=a.draft_length,
                                         threshold=a.threshold, epsilon=a.epsilon))
    text, ids, summary = [], [], None
    if not a.json:
        sys.stdout.write(a.prompt)  # the generation continues it
    if a.tls_ca:
        with open(a.tls_ca, "rb") as f:
            channel = grpc.secure_channel(a.target, grpc.ssl_channel_credentials(root_certificates=f.read()))
    else:
        channel = grpc.insecure_channel(a.target)
    metadata = [("authorization", "Bearer " + a.api_key)] if a.api_key else None
    with channel:
        stub = pb_grpc.GenerationStub(channel)
        try:
            for resp in stub.Generate(req, timeout=a.timeout, metadata=metadata):
                if resp.HasField("delta"):
                    text.append(resp.delta.text)
                    ids.extend(resp.delta.token_ids)
                    if not a.json:
                        sys.stdout.write(resp.delta.text)
                        sys.stdout.flush()
                else:
                    summary = resp.summary
        except grpc.RpcError as e:
            print("\nerror: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
            return 1
    from google.protobuf import json_format
    s = json_format.MessageToDict(summary, preserving_proto_field_name=True) if summary else {}
    if a.ids_out:
        with open(a.ids_out, "w") as f:
            f.write(" ".join(str(i) for i in ids) + "\n")
    if a.json:
        print(json.dumps({"text": "".join(text), "token_ids": ids, "summary": s}))
    else:
        print("\n--- %s" % json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
