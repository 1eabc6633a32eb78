// Loads the SentencePiece shim module in an isolated symbol scope.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "shared/tokenizer/internal/sentencepiece_shim.h"

namespace lede::tokenizer::internal {
namespace {

// Where the shim may be: $LEDE_SPM_SHIM, beside the running executable (and
// its ../lib), then the build tree's path compiled in.
std::vector<std::string> ShimCandidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("LEDE_SPM_SHIM")) c.push_back(env);
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    c.push_back((exe.parent_path() / "liblede_spm_shim.so").string());
    c.push_back((exe.parent_path().parent_path() / "lib" / "liblede_spm_shim.so").string());
  }
#ifdef LEDE_SPM_SHIM_PATH
  c.push_back(LEDE_SPM_SHIM_PATH);
#endif
  return c;
}

}  // namespace

StatusOr<std::unique_ptr<SentencePieceLibrary>> SentencePieceLibrary::Load(const std::string& path) {
  std::unique_ptr<SentencePieceLibrary> lib(new SentencePieceLibrary());
  std::string tried;
  for (const std::string& candidate : ShimCandidates()) {
    if (!std::filesystem::exists(candidate)) {
      tried += " " + candidate;
      continue;
    }
    lib->module_ = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (lib->module_ != nullptr) break;
    tried += " " + candidate + " (" + dlerror() + ")";
  }
  if (lib->module_ == nullptr) {
    return UnimplementedError("SentencePiece support module liblede_spm_shim.so not found; tried:" + tried);
  }
  auto load = reinterpret_cast<decltype(&lede_spm_load)>(dlsym(lib->module_, "lede_spm_load"));
  auto info = reinterpret_cast<decltype(&lede_spm_info)>(dlsym(lib->module_, "lede_spm_info"));
  auto piece = reinterpret_cast<decltype(&lede_spm_piece)>(dlsym(lib->module_, "lede_spm_piece"));
  lib->free_ = reinterpret_cast<decltype(&lede_spm_free)>(dlsym(lib->module_, "lede_spm_free"));
  lib->encode_ = reinterpret_cast<decltype(&lede_spm_encode)>(dlsym(lib->module_, "lede_spm_encode"));
  if (!load || !info || !piece || !lib->free_ || !lib->encode_) {
    return UnimplementedError("liblede_spm_shim.so lacks its C API");
  }
  char err[512] = {0};
  lib->processor_ = load(path.c_str(), err, sizeof(err));
  if (lib->processor_ == nullptr) {
    return InvalidArgumentError(path + ": not a SentencePiece model (" + err + ")");
  }
  info(lib->processor_, &lib->vocab_size_, &lib->bos_id_, &lib->eos_id_);
  std::vector<char> buf(256);
  for (int32_t id = 0; id < lib->vocab_size_; ++id) {
    Piece p;
    int32_t n = piece(lib->processor_, id, buf.data(), buf.size(), &p.flags);
    if (n >= static_cast<int32_t>(buf.size())) {
      buf.resize(n + 1);
      n = piece(lib->processor_, id, buf.data(), buf.size(), &p.flags);
    }
    p.text.assign(buf.data(), n);
    lib->pieces_.push_back(std::move(p));
  }
  return lib;
}

SentencePieceLibrary::~SentencePieceLibrary() {
  if (processor_ != nullptr && free_ != nullptr) free_(processor_);
  // The module stays loaded: unloading libraries with static protobuf state is unsafe.
}

StatusOr<std::vector<int32_t>> SentencePieceLibrary::Encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size() + 8);
  int64_t n = encode_(processor_, text.data(), text.size(), ids.data(), ids.size());
  if (n > static_cast<int64_t>(ids.size())) {
    ids.resize(n);
    n = encode_(processor_, text.data(), text.size(), ids.data(), ids.size());
  }
  if (n < 0) return InternalError("libsentencepiece failed to encode");
  ids.resize(n);
  return ids;
}

}  // namespace lede::tokenizer::internal
