// File: shared/checkpoint/gguf_tensor_types.cc
//
// The ggml tensor types of a GGUF file (contracts in gguf.h): their names,
// byte sizes, and the conversions of their data from and to float32. The
// block formats themselves (Q4_0 ... Q6_K) are ggml_quants.cc; the F16 and
// BF16 number formats number_formats.cc.
#include "shared/checkpoint/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace lede::checkpoint {

const char* GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
    case GgmlType::kBF16: return "BF16";
  }
  return "?";
}

size_t GgmlTypeBytes(GgmlType type, int64_t numel) {
  const auto n = static_cast<size_t>(numel);
  switch (type) {
    case GgmlType::kF32: return n * 4;
    case GgmlType::kF16: case GgmlType::kBF16: return n * 2;
    default: return n / static_cast<size_t>(GgmlBlockValues(type)) * GgmlBlockBytes(type);
  }
}

Status DequantizeToF32(const GgufTensor& t, float* out) {
  const int64_t n = t.numel();
  if (t.data == nullptr && n > 0) return InvalidArgumentError("tensor " + t.name + ": no data");
  if (t.nbytes != GgmlTypeBytes(t.type, n)) return InvalidArgumentError("tensor " + t.name + ": byte count");
  const uint8_t* p = t.data;
  switch (t.type) {
    case GgmlType::kF32:
      std::memcpy(out, p, static_cast<size_t>(n) * 4);
      return OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(out + i, &bits, 4);
      }
      return OkStatus();
    default:
      if (!DequantizeGgmlRow(t.type, p, n, out)) {
        return InvalidArgumentError("tensor " + t.name + ": " + GgmlTypeName(t.type) + " length " +
                                    std::to_string(n));
      }
      return OkStatus();
  }
  return InvalidArgumentError("tensor " + t.name + ": unsupported type");
}

StatusOr<std::vector<uint8_t>> QuantizeFromF32(const float* x, int64_t n, GgmlType type) {
  if (n < 0) return InvalidArgumentError("QuantizeFromF32: negative length");
  if (n % GgmlBlockValues(type) != 0) {
    return InvalidArgumentError(std::string(GgmlTypeName(type)) + ": " + std::to_string(n) +
                                " values is not a multiple of " + std::to_string(GgmlBlockValues(type)));
  }
  std::vector<uint8_t> out(GgmlTypeBytes(type, n));
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out.data(), x, out.size());
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = type == GgmlType::kF16 ? FloatToHalf(x[i]) : FloatToBf16(x[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      break;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / kQ8_0BlockValues; ++b) {
        const float* v = x + b * kQ8_0BlockValues;
        float amax = 0.0f;
        for (int64_t j = 0; j < kQ8_0BlockValues; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127.0f;
        const float inv = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t* blk = out.data() + b * kQ8_0BlockBytes;
        const uint16_t dh = FloatToHalf(d);
        std::memcpy(blk, &dh, 2);
        for (int64_t j = 0; j < kQ8_0BlockValues; ++j) {
          const float q = std::round(v[j] * inv);
          blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
        }
      }
      break;
    default:
      if (!QuantizeGgmlRow(type, x, n, out.data())) {
        return InvalidArgumentError(std::string("cannot quantize to ") + GgmlTypeName(type));
      }
      break;
  }
  return out;
}

}  // namespace lede::checkpoint
