#!/usr/bin/python3
"""Writes the checked-in seed corpora of the fuzz targets (tests/fuzz/<target>/corpus/).

usage: tests/fuzz/make_seed_corpus.py [SOURCE_ROOT]

A few small valid and invalid examples per target, deterministic, so that
the corpora can be regenerated and reviewed. Needs protoc (for the
experience shard seeds) and testdata/models/stories260K/tok512.bin when
present (else a synthetic llama2.c vocabulary). Inputs found by the fuzzer
that crashed once are kept as files named regression-* and are not touched.
"""
import json
import os
import struct
import subprocess
import sys
import zlib

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
FUZZ = os.path.join(ROOT, "tests", "fuzz")


def write(target, name, data):
    d = os.path.join(FUZZ, target, "corpus")
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def seeds_safetensors():
    t = "safetensors_header"
    write(t, "valid_f32", safetensors({"w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))}, {"format": "pt"}))
    write(t, "valid_mixed", safetensors({"a": ("F16", [3], b"\x00<\x00@\x00B"), "b": ("BF16", [1], b"\x80?"),
                                         "c": ("F64", [1], struct.pack("<d", 0.5)), "e": ("F32", [0], b"")}))
    write(t, "overlap", struct.pack("<Q", 80) + json.dumps(
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
         "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}).encode()[:80].ljust(80) + b"\0" * 8)
    write(t, "length_past_end", struct.pack("<Q", 1 << 40) + b"{}")
    write(t, "bad_dtype", safetensors({"w": ("Q4", [1], b"\0")}))
    write(t, "short", b"\x01\x00")


def seeds_model_config():
    t = "model_config"
    with open(os.path.join(ROOT, "models", "lede-tiny", "config.json"), "rb") as f:
        write(t, "lede_tiny", f.read())
    write(t, "llama3_rope", json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": [2, 3]}))
    write(t, "missing_field", '{"hidden_size": 64}')
    write(t, "wrong_type", '{"hidden_size": "64", "num_hidden_layers": -1}')
    write(t, "not_json", "{\"hidden_size\": 6")


def seeds_hf_tokenizer():
    t = "hf_tokenizer"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ,.!?0123456789"):
        vocab[c] = 3 + i
    vocab["he"] = len(vocab)
    vocab["ll"] = len(vocab)
    vocab["hell"] = len(vocab)
    bpe = {
        "version": "1.0",
        "added_tokens": [{"id": 1, "content": "<s>", "special": True}, {"id": 2, "content": "</s>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s?\\p{L}+|\\s?\\p{N}+|[^\\s\\p{L}\\p{N}]+|\\s+"},
                          "behavior": "Isolated", "invert": False},
        "decoder": None,
        "model": {"type": "BPE", "vocab": vocab, "merges": ["h e", "l l", "he ll"], "unk_token": "<unk>",
                  "byte_fallback": False},
    }
    write(t, "bpe_split", json.dumps(bpe))
    bl = dict(bpe)
    bl["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    bl["decoder"] = {"type": "ByteLevel"}
    write(t, "bpe_bytelevel", json.dumps(bl))
    cfg = json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": True,
                      "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    write(t, "with_config", cfg + "\0" + json.dumps(bpe))
    write(t, "bad_merge", json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a zz"]}}))
    write(t, "unknown_model", json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}))
    write(t, "not_json", "{\"model\": [")


def llama2c(pieces, max_len=None):
    max_len = max_len or max(1, max(len(p) for p in pieces))
    out = struct.pack("<i", max_len)
    for i, p in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(p)) + p
    return out


def seeds_llama2c():
    t = "llama2c_tokenizer"
    tok512 = os.path.join(ROOT, "testdata", "models", "stories260K", "tok512.bin")
    if os.path.exists(tok512):
        with open(tok512, "rb") as f:
            write(t, "tok512", f.read())
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % b for b in range(256)] + [b" ", b"a", b" a", b"aa"]
    write(t, "synthetic_263", llama2c(pieces))
    write(t, "three_tokens", llama2c([b"<unk>", b"<s>", b"</s>"]))
    write(t, "truncated", llama2c(pieces)[:-3])
    write(t, "negative_length", struct.pack("<i", 4) + struct.pack("<fi", 0.0, -1))
    write(t, "zero_max_length", struct.pack("<i", 0))


def transition_payload(text):
    proto_dir = os.path.join(ROOT)
    return subprocess.run(["protoc", "--encode=lede.v1.Transition", "-I", proto_dir,
                           os.path.join(proto_dir, "proto/lede/v1/experience.proto")],
                          input=text.encode(), capture_output=True, check=True).stdout


def shard(payloads):
    out = b"LEDEXP1\n"
    for p in payloads:
        out += struct.pack("<II", len(p), zlib.crc32(p) & 0xffffffff) + p
    return out


def seeds_experience():
    t = "experience_shard"
    state = " ".join("state: %g" % (0.1 * i) for i in range(11))
    nxt = " ".join("next_state: %g" % (0.2 * i) for i in range(11))
    a = transition_payload(state + " " + nxt + " action: EXIT_ACTION_EXIT reward: 1.5 phase: PHASE_EXIT_LAYER "
                           "layer: 2 n_layers: 12 request_id: 'r1' round_index: 3 policy_version: 'v1' "
                           "candidate_layers: 2 candidate_layers: 4 exit_tokens: 5 verifier_token: 5 time_us: 7")
    b = transition_payload(state + " action: EXIT_ACTION_CONTINUE reward: -0.01 done: true "
                           "phase: PHASE_DRAFT_LENGTH layer: 4 n_layers: 12 draft_pos: 1")
    bad = transition_payload("state: 1 state: 2 action: EXIT_ACTION_EXIT")
    write(t, "two_records", shard([a, b]))
    write(t, "empty_shard", shard([]))
    write(t, "record_payload", a)  # the target also frames the input as one record
    write(t, "wrong_feature_count", shard([bad]))
    s = bytearray(shard([a, b]))
    s[20] ^= 0xff
    write(t, "bad_checksum", bytes(s))
    write(t, "truncated", shard([a])[:-5])
    write(t, "bad_magic", b"LEDEXP0\n" + shard([a])[8:])


def seeds_generate_request():
    # FuzzedDataProvider input: any bytes map to a request; a few varied ones.
    t = "generate_request"
    write(t, "zeros", b"\0" * 64)
    write(t, "ones", b"\xff" * 64)
    write(t, "text", b"Once upon a time\\there was a stop\\\x05\x00\x00\x00\x01\x02\x03" * 3)
    write(t, "counting", bytes(range(256)))


def seeds_openai_request():
    t = "openai_request"
    write(t, "completion", b"\0" + json.dumps({"model": "lede-tiny", "prompt": "Once upon a time", "max_tokens": 8,
                                                "temperature": 0, "stop": ["\n", "The end"], "seed": 3}).encode())
    write(t, "completion_stream", b"\0" + json.dumps({"prompt": ["one"], "stream": True,
                                                       "stream_options": {"include_usage": True},
                                                       "speculation": {"method": "static", "exit_layer": 2,
                                                                       "draft_length": 3}}).encode())
    write(t, "chat", b"\1" + json.dumps({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                                     {"role": "user", "content": "Hi"}],
                                          "max_completion_tokens": 4, "top_p": 0.9, "n": 1}).encode())
    write(t, "chat_parts", b"\1" + json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "speculation": {"method": "threshold", "threshold": 0.5, "epsilon": 0.1}}).encode())
    write(t, "bad_types", b"\0" + json.dumps({"prompt": 5, "max_tokens": "x", "n": 2, "logprobs": 1}).encode())
    write(t, "not_object", b"\1[1, 2, 3]")
    write(t, "not_json", b"\0{\"prompt\": \"a")
    # Nesting just past the depth limit in a known field and in the
    # chat messages (the fuzzer mutates from here toward deeper and odder shapes).
    write(t, "deep_prompt", b"\0{\"prompt\": " + b"[" * 70 + b"1" + b"]" * 70 + b"}")
    write(t, "deep_messages", b"\1{\"messages\": [{\"role\": \"user\", \"content\": " + b"[" * 70 + b"]" * 70 +
          b"}]}")


def gguf_string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, payload):
    return gguf_string(key) + struct.pack("<I", vtype) + payload


def gguf_file(kvs, tensors, version=3, align=32):
    """kvs: encoded records; tensors: (name, ggml type, ne list, raw bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    blob, infos = b"", b""
    for name, gtype, ne, raw in tensors:
        blob += b"\0" * (-len(blob) % align)
        infos += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", gtype, len(blob))
        blob += raw
    head += infos
    return head + b"\0" * (-len(head) % align) + blob


def seeds_gguf():
    t = "gguf"
    u32 = lambda k, v: gguf_kv(k, 4, struct.pack("<I", v))
    f32 = lambda k, v: gguf_kv(k, 6, struct.pack("<f", v))
    tokens = ["<unk>", "<s>", "</s>", "\u2581a", "b", "\u2581", "a"]
    kvs = [gguf_kv("general.architecture", 8, gguf_string("llama")),
           u32("llama.context_length", 16), u32("llama.embedding_length", 32), u32("llama.block_count", 1),
           u32("llama.feed_forward_length", 64), u32("llama.attention.head_count", 2),
           u32("llama.attention.head_count_kv", 1), f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
           gguf_kv("tokenizer.ggml.model", 8, gguf_string("llama")),
           gguf_kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(map(gguf_string, tokens))),
           gguf_kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(tokens)) +
                   struct.pack("<%df" % len(tokens), *[0, 0, 0, -1, -2, -3, -4])),
           gguf_kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(tokens)) +
                   struct.pack("<%di" % len(tokens), 2, 3, 3, 1, 1, 1, 1)),
           u32("tokenizer.ggml.bos_token_id", 1), u32("tokenizer.ggml.eos_token_id", 2)]
    d, h, v, kv = 32, 64, len(tokens), 16
    f = lambda n: struct.pack("<%df" % n, *[((i * 7) % 11 - 5) / 10 for i in range(n)])
    q8 = lambda rows, cols: b"".join(struct.pack("<e", 0.01) + bytes(range(32)) for _ in range(rows * cols // 32))
    tensors = [("token_embd.weight", 0, [d, v], f(d * v)), ("blk.0.attn_norm.weight", 0, [d], f(d)),
               ("blk.0.attn_q.weight", 8, [d, d], q8(d, d)), ("blk.0.attn_k.weight", 1, [d, kv], f(d * kv // 2)),
               ("blk.0.attn_v.weight", 30, [d, kv], f(d * kv // 2)), ("blk.0.attn_output.weight", 0, [d, d], f(d * d)),
               ("blk.0.ffn_norm.weight", 0, [d], f(d)), ("blk.0.ffn_gate.weight", 0, [d, h], f(d * h)),
               ("blk.0.ffn_up.weight", 0, [d, h], f(d * h)), ("blk.0.ffn_down.weight", 0, [h, d], f(h * d)),
               ("output_norm.weight", 0, [d], f(d))]
    valid = gguf_file(kvs, tensors)
    write(t, "valid_llama", valid)
    write(t, "truncated", valid[: len(valid) - 100])
    write(t, "bad_magic", b"GGUG" + valid[4:])
    write(t, "version_1", valid[:4] + struct.pack("<I", 1) + valid[8:])
    write(t, "q4_tensor", gguf_file([], [("w", 2, [32], b"\0" * 18)]))
    write(t, "wrong_dims", gguf_file(kvs, [(n, ty, list(reversed(ne)) if n == "blk.0.ffn_up.weight" else ne, raw)
                                           for n, ty, ne, raw in tensors]))
    write(t, "huge_array", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_kv("a", 9, struct.pack("<IQ", 8, 1 << 60)))


if __name__ == "__main__":
    seeds_safetensors()
    seeds_gguf()
    seeds_model_config()
    seeds_hf_tokenizer()
    seeds_llama2c()
    seeds_experience()
    seeds_generate_request()
    seeds_openai_request()
