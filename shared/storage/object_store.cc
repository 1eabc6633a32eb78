#include "shared/storage/object_store.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "shared/storage/local_store.h"
#include "shared/storage/s3_store.h"

namespace lede::storage {
namespace {

Status BadKey(std::string_view what, std::string_view key, std::string_view why) {
  return InvalidArgumentError(std::string(what) + " \"" + std::string(key) + "\": " + std::string(why));
}

// Checks the '/'-separated components of `s` (no leading '/', no empty
// component, none starting with '.', no NUL). `allow_trailing_slash` admits
// one final '/'.
Status CheckPath(std::string_view what, std::string_view s, bool allow_trailing_slash) {
  if (s.find('\0') != std::string_view::npos) return BadKey(what, s, "contains a NUL byte");
  if (!s.empty() && s.front() == '/') return BadKey(what, s, "must not start with '/'");
  std::string_view rest = s;
  if (allow_trailing_slash && !rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.empty()) return OkStatus();
  size_t start = 0;
  while (true) {
    const size_t end = rest.find('/', start);
    const std::string_view part =
        rest.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (part.empty()) return BadKey(what, s, "empty path component ('//' or trailing '/')");
    if (part == "..") return BadKey(what, s, "'..' is not allowed");
    if (part.front() == '.') return BadKey(what, s, "components must not start with '.'");
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return OkStatus();
}

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

StatusOr<std::unique_ptr<ObjectStore>> OpenS3(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("bad object store url \"" + std::string(url) + "\": " + why);
  };
  std::string_view rest = url.substr(5);  // after "s3://"
  std::string_view query;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  S3Options o;
  const size_t slash = rest.find('/');
  o.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    o.prefix = std::string(prefix);
  }
  if (o.bucket.empty()) return bad("no bucket (expected s3://bucket/prefix)");

  std::string endpoint, region, max_keys;
  bool have_endpoint = false, have_region = false, have_max_keys = false;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (param.empty()) continue;
    const size_t eq = param.find('=');
    if (eq == std::string_view::npos) return bad("query parameter without '=': " + std::string(param));
    const std::string name(param.substr(0, eq));
    const std::string value(param.substr(eq + 1));
    if (name == "endpoint") {
      endpoint = value;
      have_endpoint = true;
    } else if (name == "region") {
      region = value;
      have_region = true;
    } else if (name == "max_keys") {
      max_keys = value;
      have_max_keys = true;
    } else {
      return bad("unknown query parameter \"" + name + "\" (known: endpoint, region, max_keys)");
    }
  }
  if (!have_endpoint) {
    endpoint = Getenv("AWS_ENDPOINT_URL_S3");
    if (endpoint.empty()) endpoint = Getenv("AWS_ENDPOINT_URL");
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  o.endpoint = endpoint;
  if (!have_region) {
    region = Getenv("AWS_REGION");
    if (region.empty()) region = Getenv("AWS_DEFAULT_REGION");
  }
  if (!region.empty()) o.region = region;
  if (have_max_keys) {
    char* end = nullptr;
    const long n = std::strtol(max_keys.c_str(), &end, 10);
    if (max_keys.empty() || *end != '\0' || n < 1 || n > 1000) return bad("max_keys must be in 1..1000");
    o.max_keys = static_cast<int>(n);
  }
  o.access_key_id = Getenv("AWS_ACCESS_KEY_ID");
  o.secret_access_key = Getenv("AWS_SECRET_ACCESS_KEY");
  o.session_token = Getenv("AWS_SESSION_TOKEN");
  StatusOr<std::unique_ptr<S3Store>> store = S3Store::Create(std::move(o));
  if (!store.ok()) return bad(std::string(store.status().message()));
  return std::unique_ptr<ObjectStore>(std::move(store).value());
}

}  // namespace

Status ValidateKey(std::string_view key) {
  if (key.empty()) return InvalidArgumentError("object key is empty");
  return CheckPath("object key", key, /*allow_trailing_slash=*/false);
}

Status ValidatePrefix(std::string_view prefix) {
  return CheckPath("list prefix", prefix, /*allow_trailing_slash=*/true);
}

StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(std::string_view url) {
  if (url.empty()) return InvalidArgumentError("bad object store url \"\": empty");
  if (url.substr(0, 5) == "s3://") return OpenS3(url);
  std::string path;
  if (url.substr(0, 7) == "file://") {
    path = std::string(url.substr(7));
    if (path.empty() || path.front() != '/') {
      return InvalidArgumentError("bad object store url \"" + std::string(url) +
                                  "\": file:// needs an absolute path (file:///abs/dir)");
    }
  } else if (url.find("://") != std::string_view::npos) {
    return InvalidArgumentError("bad object store url \"" + std::string(url) +
                                "\": unknown scheme (expected file:// or s3://, or a plain path)");
  } else {
    path = std::string(url);
  }
  StatusOr<std::unique_ptr<LocalStore>> store = LocalStore::Open(path);
  if (!store.ok()) return store.status();
  return std::unique_ptr<ObjectStore>(std::move(store).value());
}

}  // namespace lede::storage
