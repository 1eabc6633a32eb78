// File: shared/tokenizer/hf_tokenizer.cc
//
// tokenizer.json loading and BPE encoding. The pipeline of Encode():
//   added tokens split the raw text -> each other segment: normalizer ->
//   pre-tokenizer pieces -> BPE per piece -> ids.
// The BPE merge loop keeps the symbols of a piece in a doubly linked list
// and the candidate pairs in a min-heap ordered by (rank, position), so a
// piece of n symbols costs O(n log n); a popped pair is used only if both
// symbols are still the ones it was made from (lazy deletion).

#include "shared/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <queue>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/internal/hf_tokenizer_impl.h"

namespace lede::tokenizer {
namespace internal {

// Length of the (valid) UTF-8 character that starts with `lead`.
size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// GPT-2's reversible map from bytes to printable code points: printable
// Latin-1 bytes map to themselves, the other 68 to 256, 257, ... in order.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> map(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    map[b] = printable ? b : next++;
  }
  return map;
}

// Decodes a byte-level model string ("Ġthe") back to raw bytes (" the").
// Characters outside the map are kept as their UTF-8 bytes.
std::string ByteLevelToBytes(std::string_view s, const ByteInverse& inverse) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t n = std::min(Utf8Length(lead), s.size() - i);
    uint32_t cp = lead;
    if (n == 2) cp = ((lead & 0x1F) << 6) | (s[i + 1] & 0x3F);
    if (n == 3) cp = ((lead & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    if (n == 4) {
      cp = ((lead & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    }
    auto it = inverse.find(cp);
    if (it != inverse.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

// "<0x0A>" -> 0x0A.
std::optional<uint8_t> ByteFallbackValue(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return std::nullopt;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    v *= 16;
    if (c >= '0' && c <= '9') {
      v += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      v += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      v += c - 'a' + 10;
    } else {
      return std::nullopt;
    }
  }
  return static_cast<uint8_t>(v);
}

ByteInverse InverseByteMap() {
  const std::vector<uint32_t> byte_map = ByteToCodePoint();
  ByteInverse inverse;
  for (uint32_t b = 0; b < 256; ++b) inverse[byte_map[b]] = static_cast<uint8_t>(b);
  return inverse;
}

}  // namespace internal

using internal::AddedToken;
using internal::ByteLevelToBytes;
using internal::InverseByteMap;
using internal::kMetaspace;
using internal::PreTokenizerStep;
using internal::Regex;
using internal::ReplaceAll;
using internal::Utf8Length;

namespace {

// Splits each piece by `regex`; matches and gaps become pieces ("Isolated"),
// or matches are dropped ("Removed"); with `invert` the roles swap.
Status RegexSplit(const Regex& regex, bool remove_matches, bool invert, const std::vector<std::string>& in,
                  std::vector<std::string>* out, const std::string& source) {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex.code, nullptr);
  if (md == nullptr) return InternalError(source + ": PCRE2 match data allocation failed");
  Status status = OkStatus();
  for (const std::string& s : in) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;   // next byte to search from
    size_t last = 0;  // end of the last emitted piece
    auto emit = [&](size_t b, size_t e, bool is_match) {
      if (e <= b) return;
      const bool keep = invert ? is_match : (!is_match || !remove_matches);
      const bool as_gap_removed = invert && !is_match && remove_matches;
      if (keep && !as_gap_removed) out->push_back(s.substr(b, e - b));
    };
    while (pos <= s.size()) {
      const int rc = pcre2_match(regex.code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof(buf));
        status = InternalError(source + ": regex match failed: " + reinterpret_cast<const char*>(buf));
        break;
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step over one character
        if (b >= s.size()) break;
        pos = b + Utf8Length(static_cast<unsigned char>(s[b]));
        continue;
      }
      emit(last, b, false);
      emit(b, e, true);
      last = e;
      pos = e;
    }
    if (!status.ok()) break;
    emit(last, s.size(), false);
  }
  pcre2_match_data_free(md);
  return status;
}

}  // namespace

Status HfTokenizer::Impl::ApplyPreTokenizer(const std::string& segment, bool first_segment,
                                            std::vector<std::string>* pieces) const {
  pieces->assign(1, segment);
  for (const PreTokenizerStep& step : pre_tokenizer) {
    std::vector<std::string> next;
    if (step.kind == PreTokenizerStep::Kind::kMetaspace) {
      for (std::string p : *pieces) {
        ReplaceAll(&p, " ", step.replacement);
        const bool prepend = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                             (step.prepend == PreTokenizerStep::Prepend::kFirst && first_segment);
        if (prepend && p.compare(0, step.replacement.size(), step.replacement) != 0) p = step.replacement + p;
        if (!step.split) {
          next.push_back(std::move(p));
          continue;
        }
        // Each word starts at a replacement character (MergedWithNext).
        size_t start = 0;
        size_t pos = p.find(step.replacement, 1);
        while (pos != std::string::npos) {
          next.push_back(p.substr(start, pos - start));
          start = pos;
          pos = p.find(step.replacement, pos + step.replacement.size());
        }
        next.push_back(p.substr(start));
      }
    } else {
      LEDE_RETURN_IF_ERROR(RegexSplit(*step.regex, step.remove_matches, step.invert, *pieces, &next, source));
    }
    *pieces = std::move(next);
  }
  if (byte_level_add_prefix_space) {
    for (std::string& p : *pieces) {
      if (p.empty() || p[0] != ' ') p.insert(p.begin(), ' ');
    }
  }
  return OkStatus();
}

void HfTokenizer::Impl::Bpe(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    if (auto id = Lookup(piece)) {
      ids->push_back(*id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  auto push = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  if (byte_level) {
    for (const char c : piece) {
      const int32_t id = byte_ids[static_cast<unsigned char>(c)];
      if (id >= 0) {
        push(id);
      } else if (unk_id >= 0) {
        push(unk_id);
      }
    }
  } else {
    size_t i = 0;
    bool last_unk = false;
    while (i < piece.size()) {
      const size_t n = std::min(Utf8Length(static_cast<unsigned char>(piece[i])), piece.size() - i);
      const std::string_view ch = piece.substr(i, n);
      i += n;
      if (auto id = Lookup(ch)) {
        push(*id);
        last_unk = false;
        continue;
      }
      bool all_bytes = byte_fallback;
      if (byte_fallback) {
        for (const char c : ch) all_bytes = all_bytes && byte_ids[static_cast<unsigned char>(c)] >= 0;
      }
      if (all_bytes) {
        for (const char c : ch) push(byte_ids[static_cast<unsigned char>(c)]);
        last_unk = false;
      } else if (unk_id >= 0) {
        if (!(fuse_unk && last_unk)) push(unk_id);
        last_unk = true;
      }
    }
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;  // left symbol
    int32_t left_id, right_id, merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(symbols[left].id)) << 32) |
                         static_cast<uint32_t>(symbols[right].id);
    auto it = merges.find(key);
    if (it == merges.end()) return;
    heap.push({it->second.first, left, symbols[left].id, symbols[right].id, it->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    if (!left.alive || left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (!right.alive || right.id != c.right_id) continue;
    left.id = c.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

Status HfTokenizer::Impl::EncodeSegment(std::string_view segment, bool first_segment,
                                        std::vector<int32_t>* ids) const {
  if (segment.empty()) return OkStatus();
  std::string normalized(segment);
  if (!normalizer_prepend.empty()) normalized = normalizer_prepend + normalized;
  for (const auto& [from, to] : normalizer_replace) ReplaceAll(&normalized, from, to);
  std::vector<std::string> pieces;
  LEDE_RETURN_IF_ERROR(ApplyPreTokenizer(normalized, first_segment, &pieces));
  for (const std::string& p : pieces) Bpe(p, ids);
  return OkStatus();
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError("tokenizer file '" + path + "' not found");
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  LEDE_ASSIGN_OR_RETURN(HfTokenizerConfig config, ReadHfTokenizerConfig(dir.string()));
  return FromJson(text, path, config);
}

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(const std::string& json_text, const std::string& source,
                                                              const HfTokenizerConfig& config) {
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, internal::ParseTokenizerJson(json_text, source, config));
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

int32_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }
bool HfTokenizer::DefaultAddBos() const { return impl_->default_add_bos; }
bool HfTokenizer::DefaultAddEos() const { return impl_->default_add_eos; }

std::optional<int32_t> HfTokenizer::TokenId(std::string_view content) const {
  for (const AddedToken& a : impl_->added) {
    if (a.content == content) return a.id;
  }
  if (impl_->byte_level) {
    return impl_->Lookup(ByteLevelToBytes(content, InverseByteMap()));
  }
  return impl_->Lookup(content);
}

StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text, bool add_bos, bool add_eos) const {
  if (!IsValidUtf8(text)) return InvalidArgumentError("text is not valid UTF-8");
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  if (add_bos && t.bos >= 0) ids.push_back(t.bos);

  // Added tokens first: at each position the longest token that starts
  // there; lstrip/rstrip take the whitespace beside a token with it.
  size_t seg_start = 0;
  size_t pos = 0;
  bool first_segment = true;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    for (const size_t k : t.added_by_first_byte[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& a = t.added[k];
      if (text.compare(pos, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t seg_end = pos;
    if (hit->lstrip) {
      while (seg_end > seg_start && is_space(text[seg_end - 1])) --seg_end;
    }
    LEDE_RETURN_IF_ERROR(t.EncodeSegment(text.substr(seg_start, seg_end - seg_start), first_segment, &ids));
    if (seg_end > seg_start) first_segment = false;
    ids.push_back(hit->id);
    first_segment = false;
    pos += hit->content.size();
    if (hit->rstrip) {
      while (pos < text.size() && is_space(text[pos])) ++pos;
    }
    seg_start = pos;
  }
  LEDE_RETURN_IF_ERROR(t.EncodeSegment(text.substr(seg_start), first_segment, &ids));
  if (add_eos && t.eos >= 0) ids.push_back(t.eos);
  return ids;
}

std::string HfTokenizer::TokenBytes(int32_t prev_id, int32_t id) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= t.vocab_size || t.contributes_nothing[id]) return std::string();
  const std::string& bytes = t.token_bytes[id];
  const bool at_start = prev_id < 0 || prev_id == t.bos;
  if (t.strip_space_after_special && at_start && !bytes.empty() && bytes[0] == ' ') return bytes.substr(1);
  return bytes;
}

std::string HfTokenizer::Decode(const std::vector<int32_t>& ids) const {
  const Impl& t = *impl_;
  std::string bytes;
  bool first = true;
  for (const int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size || t.contributes_nothing[id]) continue;
    const std::string& b = t.token_bytes[id];
    if (first && t.strip_space_after_special && !b.empty() && b[0] == ' ') {
      bytes.append(b, 1, std::string::npos);
    } else {
      bytes += b;
    }
    if (!b.empty()) first = false;
  }
  return SanitizeUtf8(bytes);
}

}  // namespace lede::tokenizer
