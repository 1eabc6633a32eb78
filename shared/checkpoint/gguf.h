// File: shared/checkpoint/gguf.h
//
// The GGUF file format (llama.cpp's single-file checkpoints), torch-free:
// a bounds-checked reader over a read-only mapping, a writer, and the
// Llama-architecture mapping between GGUF metadata / tensor names and this
// project's ModelConfig / Hugging Face tensor names.
//
// Layout of a GGUF v3 file (all little-endian; format: ggml's docs/gguf.md):
//   "GGUF" | uint32 version (3) | uint64 n_tensors | uint64 n_kv
//   n_kv x  { string key, uint32 value_type, value }
//   n_tensors x { string name, uint32 n_dims, uint64 ne[n_dims],
//                 uint32 ggml_type, uint64 offset }
//   padding to general.alignment (default 32), then the tensor data; each
//   offset is relative to the data start and a multiple of the alignment.
// A string is uint64 length + bytes (no terminator); an array is uint32
// element type + uint64 count + elements. ne[0] is the innermost (fastest
// varying) dimension: a Hugging Face [out, in] weight has ne = {in, out}.
//
// Tensor types read: F32 (0), F16 (1), BF16 (30) and llama.cpp's block
// types along ne[0]: Q4_0 (2), Q5_0 (6), Q8_0 (8: blocks of 32 weights,
// each one f16 scale d followed by 32 int8 q, value = d * q; 34 bytes),
// Q4_K (12), Q5_K (13), Q6_K (14) (blocks of 256; layouts in
// ggml_quants.h). Any other type is refused at Open (its byte size is not
// known, so the file cannot be bounds-checked).
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(auto gguf, checkpoint::GgufFile::Open(path));
//   LEDE_ASSIGN_OR_RETURN(model::ModelConfig config, checkpoint::GgufLlamaConfig(*gguf));
//   const checkpoint::GgufTensor* t = gguf->FindTensor("blk.0.attn_q.weight");
//   std::vector<float> w(t->numel());
//   LEDE_RETURN_IF_ERROR(checkpoint::DequantizeToF32(*t, w.data()));
//
// Thread-safety: a GgufFile is immutable after Open; share it freely. A
// GgufWriter is not thread-safe.
#ifndef LEDE_SHARED_CHECKPOINT_GGUF_H_
#define LEDE_SHARED_CHECKPOINT_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shared/checkpoint/ggml_quants.h"
#include "shared/checkpoint/mapped_file.h"
#include "shared/checkpoint/model_config.h"
#include "shared/checkpoint/number_formats.h"
#include "shared/status/status.h"

namespace lede::checkpoint {

// (GgmlType, the ggml tensor types read and written, and their block
// layouts: ggml_quants.h, included above.)

inline constexpr int64_t kQ8_0BlockValues = 32;  // weights per block
inline constexpr size_t kQ8_0BlockBytes = 34;    // f16 scale + 32 int8

// "F32", "F16", "Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "BF16".
const char* GgmlTypeName(GgmlType type);

// Bytes of `numel` values stored as `type` (numel a multiple of
// GgmlBlockValues(type): 32 for Q4_0 / Q5_0 / Q8_0, 256 for the K types).
size_t GgmlTypeBytes(GgmlType type, int64_t numel);

// Metadata value types (values as in the file).
enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5,
  kFloat32 = 6, kBool = 7, kString = 8, kArray = 9, kUint64 = 10,
  kInt64 = 11, kFloat64 = 12,
};

// One metadata value. Scalars: integers in `i` (unsigned values above
// INT64_MAX are refused at Open), floats in `f`, bools in `i` (0/1), strings
// in `str`. Arrays: `array_type` and either `strings` or `numbers` (every
// numeric or bool element widened to double; exact for |x| < 2^53).
// Arrays of arrays are refused at Open.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint32;
  int64_t i = 0;
  double f = 0.0;
  std::string str;
  GgufValueType array_type = GgufValueType::kUint32;
  std::vector<std::string> strings;
  std::vector<double> numbers;

  bool is_integer() const;  // a scalar integer type
  bool is_float() const;    // kFloat32 / kFloat64
};

// One tensor of a GgufFile. `data` points into the file's read-only mapping
// (valid while the GgufFile lives; may be unaligned); for the quantized
// types these are the raw blocks, usable as they are by the kernels.
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // ggml order: ne[0] innermost
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  uint64_t offset = 0;  // relative to the data section

  int64_t numel() const;
  // Torch order (outermost first): ne reversed. {in, out} -> [out, in].
  std::vector<int64_t> shape() const;
};

// A parsed, validated GGUF file.
class GgufFile {
 public:
  // Maps `path` and parses it (Parse). Errors: kNotFound for a missing
  // file; kPermissionDenied; kInternal for a failed mmap; those of Parse.
  static StatusOr<std::shared_ptr<const GgufFile>> Open(const std::string& path);

  // Parses `size` bytes at `data` (owned by `owner`, kept alive by the
  // result); `source` names the file in errors. Every read is checked
  // against `size`: nothing past the end is touched.
  // Errors (kInvalidArgument, one message naming `source` and the key or
  // tensor at fault): bad magic, a version other than 2 or 3, a count or
  // length running past the end or beyond the reader's bounds (checked
  // before anything is allocated for it, so that a sparse file's apparent
  // size buys nothing: at most 2^16 keys of up to 65535 bytes, 2^18 tensors
  // with names of up to 64 bytes, 256 MiB of decoded metadata; gguf.cc),
  // an unknown value type, an array of
  // arrays, a duplicate key or tensor name, general.alignment that is not a
  // power of two, a tensor with 0 or more than 4 dims, a non-positive dim,
  // an unsupported tensor type (named with its number), a block-quantized
  // tensor whose ne[0] is not a multiple of its block (32 or 256), an offset not a multiple of the
  // alignment, data past the end of the file, overlapping tensors.
  static StatusOr<std::shared_ptr<const GgufFile>> Parse(std::shared_ptr<const void> owner, const uint8_t* data,
                                                         size_t size, const std::string& source);

  const std::string& source() const { return source_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  // Tensors in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  const GgufValue* Find(const std::string& key) const;
  const GgufTensor* FindTensor(const std::string& name) const;

  // Typed getters. Errors: kNotFound naming the key when it is absent;
  // kInvalidArgument naming the key and its type when the type differs or
  // an integer is negative (GetUint) or out of int64 range.
  StatusOr<int64_t> GetInt(const std::string& key) const;  // any integer type
  StatusOr<double> GetFloat(const std::string& key) const;  // float or integer
  StatusOr<bool> GetBool(const std::string& key) const;
  StatusOr<std::string> GetString(const std::string& key) const;
  StatusOr<std::vector<std::string>> GetStringArray(const std::string& key) const;
  StatusOr<std::vector<double>> GetNumberArray(const std::string& key) const;

 private:
  GgufFile() = default;
  std::string source_;
  std::shared_ptr<const void> owner_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Widens `t` to float32 into out[0 .. t.numel()), row-major in torch order.
// Never fails for a tensor from GgufFile (kInvalidArgument otherwise).
Status DequantizeToF32(const GgufTensor& t, float* out);

// Narrowing float32 to the stored types (round to nearest even for F16 and
// BF16; Q8_0: per block d = max|x| / 127, q = round(x / d), as llama.cpp's
// reference quantizer; the other block types: QuantizeGgmlRow). `n`
// values, a multiple of GgmlBlockValues(type) (kInvalidArgument naming the
// type otherwise). The result holds GgmlTypeBytes(type, n) bytes.
StatusOr<std::vector<uint8_t>> QuantizeFromF32(const float* x, int64_t n, GgmlType type);

// (FloatToHalf, HalfToFloat, FloatToBf16: number_formats.h, included above.)

// This project's own metadata keys (FLOAT64): a checkpoint's exact
// rms_norm_eps and rope_theta, written beside llama.cpp's float32 keys only
// when those cannot give the value back (e.g. a widened checkpoint's
// eps * d/D), so that a GGUF export keeps its source's architecture
// fingerprint, by which policies and calibrations are matched. The reader
// uses them when they agree with the float32 keys to float32 precision and
// refuses the file otherwise (kInvalidArgument naming the key).
inline constexpr char kExactRmsNormEpsKey[] = "lede.rms_norm_eps";
inline constexpr char kExactRopeThetaKey[] = "lede.rope_theta";

// Writes a GGUF v3 file (alignment 32): metadata in the order added, then
// tensor infos and data in the order added. Tensor data is borrowed: it
// must stay alive until Write returns.
class GgufWriter {
 public:
  void AddString(const std::string& key, const std::string& value);
  void AddUint32(const std::string& key, uint32_t value);
  void AddInt32(const std::string& key, int32_t value);
  void AddFloat32(const std::string& key, float value);
  void AddFloat64(const std::string& key, double value);
  void AddBool(const std::string& key, bool value);
  void AddStringArray(const std::string& key, const std::vector<std::string>& values);
  void AddFloat32Array(const std::string& key, const std::vector<float>& values);
  void AddInt32Array(const std::string& key, const std::vector<int32_t>& values);

  // `shape` in torch order ([out, in]); `data` holds GgmlTypeBytes(type,
  // numel) bytes. Errors: kInvalidArgument for a duplicate name, an empty
  // shape, a byte count that disagrees, or a block-quantized type whose
  // innermost dim is not a multiple of its block (32 or 256).
  Status AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape, const void* data,
                   size_t nbytes);

  // The same with bytes the writer keeps (small tensors made on the fly).
  Status AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape,
                   std::vector<uint8_t> owned_bytes);

  // Atomically (temporary file, fsync, rename). Errors: kInternal on I/O.
  Status Write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    const void* data;
    size_t nbytes;
  };
  std::string kv_;  // serialized key/value records
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
  std::list<std::vector<uint8_t>> owned_;
};

// --- The llama architecture -------------------------------------------------

// The hyper-parameters of a general.architecture = "llama" file, from
// llama.* keys (embedding_length, feed_forward_length, block_count,
// attention.head_count, attention.head_count_kv (default head_count),
// context_length, attention.layer_norm_rms_epsilon, rope.freq_base,
// rope.dimension_count (must be the head dim), rope.scaling.type
// none|linear (+ rope.scaling.factor); a rope_freqs.weight tensor (how
// llama.cpp stores Llama-3.1's RoPE scaling: one divisor per frequency) is
// matched to Llama-3 scaling parameters, factor = its largest entry and
// low/high/original context from the usual values, and refused if none
// reproduces it within 1e-4), the vocabulary size from
// llama.vocab_size, tokenizer.ggml.tokens or token_embd.weight, BOS/EOS from
// tokenizer.ggml.{bos,eos,eot,eom}_token_id, tie_word_embeddings when
// output.weight is absent, rope_style kAdjacentPairs (llama.cpp's Q/K row
// order; the engine permutes at load). Then every tensor the config needs
// is checked against its GGUF dims.
// Errors: kInvalidArgument naming the key or tensor: another architecture,
// a missing or mistyped key, an unsupported rope scaling (yarn,
// rope_freqs.weight = Llama-3 scaling), partial rotary, a missing tensor,
// dims that contradict the metadata, a key outside model_limits.h's bounds
// or a block count the file's tensors cannot hold (9 per block).
StatusOr<model::ModelConfig> GgufLlamaConfig(const GgufFile& file);

// The project's (Hugging Face) name of a llama GGUF tensor and back:
// "blk.3.attn_q.weight" <-> "model.layers.3.self_attn.q_proj.weight",
// "token_embd.weight" <-> "model.embed_tokens.weight", "output.weight" <->
// "lm_head.weight", "output_norm.weight" <-> "model.norm.weight". "" for a
// name outside the mapping.
std::string GgufToHfName(const std::string& gguf_name);
std::string HfToGgufName(const std::string& hf_name);

// Adds general.architecture = "llama" and the llama.* hyper-parameter keys
// of `config` to `writer`, and for Llama-3 RoPE scaling the
// rope_freqs.weight tensor llama.cpp reads (Llama3RopeFreqFactors).
// Errors: kInvalidArgument for an invalid config.
Status AddLlamaMetadata(const model::ModelConfig& config, const std::string& name, GgufWriter* writer);

// Llama-3 RoPE scaling as per-frequency divisors (head_dim / 2 of them):
// 1 for short wavelengths, `factor` for long ones, a smooth blend between
// (the scaled inverse frequency is base^(-2i/hd) / divisor[i]).
std::vector<float> Llama3RopeFreqFactors(const model::ModelConfig& config);

}  // namespace lede::checkpoint

#endif  // LEDE_SHARED_CHECKPOINT_GGUF_H_
