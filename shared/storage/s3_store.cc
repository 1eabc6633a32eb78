#include "shared/storage/s3_store.h"

#include <curl/curl.h>
#include <tinyxml2.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <mutex>
#include <utility>

#include "shared/file/sha256.h"
#include "shared/status/status_macros.h"

namespace lede::storage {
namespace {

constexpr char kHex[] = "0123456789ABCDEF";

void GlobalInitCurl() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t AppendToString(char* data, size_t size, size_t nmemb, void* user) {
  static_cast<std::string*>(user)->append(data, size * nmemb);
  return size * nmemb;
}

bool ValidBucketName(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '-' || c == '.')) {
      return false;
    }
  }
  return b.front() != '-' && b.front() != '.' && b.back() != '-' && b.back() != '.';
}

struct HttpResponse {
  long status = 0;
  std::string body;
};

// The text of the first <name> child of `parent`, or "".
std::string ChildText(const tinyxml2::XMLElement* parent, const char* name) {
  const tinyxml2::XMLElement* e = parent != nullptr ? parent->FirstChildElement(name) : nullptr;
  const char* t = e != nullptr ? e->GetText() : nullptr;
  return t != nullptr ? t : "";
}

// Maps a non-2xx answer to a Status carrying S3's <Error><Code>/<Message>.
Status HttpError(const std::string& what, const HttpResponse& r) {
  std::string detail = "HTTP " + std::to_string(r.status);
  tinyxml2::XMLDocument doc;
  if (!r.body.empty() && doc.Parse(r.body.data(), r.body.size()) == tinyxml2::XML_SUCCESS) {
    const tinyxml2::XMLElement* err = doc.FirstChildElement("Error");
    const std::string code = ChildText(err, "Code"), message = ChildText(err, "Message");
    if (!code.empty()) detail += " " + code;
    if (!message.empty()) detail += ": " + message;
  }
  const std::string text = what + ": " + detail;
  switch (r.status) {
    case 404: return NotFoundError(text);
    case 401:
    case 403: return Status(StatusCode::kPermissionDenied, text);
    case 400: return InvalidArgumentError(text);
    case 409:
    case 412: return FailedPreconditionError(text);
    case 429: return UnavailableError(text);
    default: break;
  }
  if (r.status >= 500) return UnavailableError(text);
  return InternalError(text);
}

}  // namespace

std::string SigV4Encode(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

namespace {

// One HTTP exchange with the bucket. `object` is the bucket-relative path
// (already prefixed, not encoded; "" for the bucket itself); `query` is
// already encoded and sorted by parameter name, which makes it its own SigV4
// canonical query string whatever libcurl's signer does with it.
StatusOr<HttpResponse> Request(const S3Options& o, const char* method, const std::string& object,
                               const std::string& query, std::string_view body) {
  GlobalInitCurl();
  std::string url;
  if (o.endpoint.empty()) {
    url = "https://" + o.bucket + ".s3." + o.region + ".amazonaws.com/" + SigV4Encode(object, true);
  } else {
    url = o.endpoint + "/" + o.bucket + (object.empty() ? "" : "/" + SigV4Encode(object, true));
  }
  if (!query.empty()) url += "?" + query;
  const std::string what = std::string(method) + " " + url;

  CURL* curl = curl_easy_init();
  if (curl == nullptr) return InternalError("curl_easy_init failed");
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, ("x-amz-content-sha256: " + file::Sha256Hex(body)).c_str());
  if (!o.session_token.empty()) {
    headers = curl_slist_append(headers, ("x-amz-security-token: " + o.session_token).c_str());
  }
  headers = curl_slist_append(headers, "Expect:");
  HttpResponse response;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(o.connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(o.request_timeout)));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &AppendToString);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  const std::string method_s = method;
  if (method_s == "PUT") {
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
  } else if (method_s != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  std::string sigv4, userpwd;
  if (!o.access_key_id.empty()) {
    sigv4 = "aws:amz:" + o.region + ":s3";
    userpwd = o.access_key_id + ":" + o.secret_access_key;
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(curl, CURLOPT_USERPWD, userpwd.c_str());
  }
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return UnavailableError(what + ": " + (errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc)));
  }
  if (response.status < 200 || response.status >= 300) return HttpError(what, response);
  return response;
}

}  // namespace

StatusOr<std::unique_ptr<S3Store>> S3Store::Create(S3Options o) {
  if (!ValidBucketName(o.bucket)) {
    return InvalidArgumentError("bad S3 bucket name \"" + o.bucket + "\" (3..63 of [a-z0-9.-])");
  }
  if (!o.prefix.empty()) {
    Status s = ValidateKey(o.prefix);
    if (!s.ok()) return InvalidArgumentError("bad S3 prefix: " + std::string(s.message()));
  }
  if (!o.endpoint.empty()) {
    const size_t scheme = o.endpoint.find("://");
    const std::string proto = scheme == std::string::npos ? "" : o.endpoint.substr(0, scheme);
    if ((proto != "http" && proto != "https") || o.endpoint.size() == scheme + 3 ||
        o.endpoint.find('/', scheme + 3) != std::string::npos || o.endpoint.find('?') != std::string::npos) {
      return InvalidArgumentError("bad S3 endpoint \"" + o.endpoint + "\" (expected http[s]://host[:port])");
    }
  }
  if (o.region.empty()) return InvalidArgumentError("empty S3 region");
  if (o.max_keys < 1 || o.max_keys > 1000) return InvalidArgumentError("S3 max_keys must be in 1..1000");
  if (o.access_key_id.empty() != o.secret_access_key.empty()) {
    return InvalidArgumentError(
        "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set; set both, or neither for "
        "anonymous access");
  }
  return std::unique_ptr<S3Store>(new S3Store(std::move(o)));
}

namespace {
std::string FullKey(const S3Options& o, std::string_view key) {
  return o.prefix.empty() ? std::string(key) : o.prefix + "/" + std::string(key);
}
}  // namespace

Status S3Store::Put(std::string_view key, std::string_view bytes) {
  LEDE_RETURN_IF_ERROR(ValidateKey(key));
  StatusOr<HttpResponse> r = Request(options_, "PUT", FullKey(options_, key), "", bytes);
  return r.status();
}

StatusOr<std::string> S3Store::Get(std::string_view key) {
  LEDE_RETURN_IF_ERROR(ValidateKey(key));
  LEDE_ASSIGN_OR_RETURN(HttpResponse r, Request(options_, "GET", FullKey(options_, key), "", ""));
  return std::move(r.body);
}

Status S3Store::Delete(std::string_view key) {
  LEDE_RETURN_IF_ERROR(ValidateKey(key));
  StatusOr<HttpResponse> r = Request(options_, "DELETE", FullKey(options_, key), "", "");
  if (!r.ok() && r.status().code() == StatusCode::kNotFound) {
    // Some S3-compatible stores answer 404 NoSuchKey; S3 itself answers 204.
    if (r.status().message().find("NoSuchKey") != std::string_view::npos) return OkStatus();
  }
  return r.status();
}

StatusOr<std::vector<ObjectInfo>> S3Store::List(std::string_view prefix) {
  LEDE_RETURN_IF_ERROR(ValidatePrefix(prefix));
  const std::string full_prefix =
      options_.prefix.empty() ? std::string(prefix) : options_.prefix + "/" + std::string(prefix);
  const size_t strip = options_.prefix.empty() ? 0 : options_.prefix.size() + 1;
  std::vector<ObjectInfo> out;
  std::string token;
  for (int page = 0;; ++page) {
    // Parameters in name order (SigV4 canonical query string).
    std::string query;
    if (!token.empty()) query += "continuation-token=" + SigV4Encode(token, false) + "&";
    query += "list-type=2&max-keys=" + std::to_string(options_.max_keys);
    query += "&prefix=" + SigV4Encode(full_prefix, false);
    LEDE_ASSIGN_OR_RETURN(HttpResponse r, Request(options_, "GET", "", query, ""));
    tinyxml2::XMLDocument doc;
    if (doc.Parse(r.body.data(), r.body.size()) != tinyxml2::XML_SUCCESS) {
      return InternalError("unparsable ListObjectsV2 answer from s3://" + options_.bucket + ": " +
                           doc.ErrorStr());
    }
    const tinyxml2::XMLElement* result = doc.FirstChildElement("ListBucketResult");
    if (result == nullptr) {
      return InternalError("ListObjectsV2 answer from s3://" + options_.bucket + " has no ListBucketResult");
    }
    for (const tinyxml2::XMLElement* c = result->FirstChildElement("Contents"); c != nullptr;
         c = c->NextSiblingElement("Contents")) {
      const std::string key = ChildText(c, "Key");
      if (key.size() <= strip || key.compare(0, full_prefix.size(), full_prefix) != 0) continue;
      ObjectInfo info;
      info.key = key.substr(strip);
      info.size_bytes = std::atoll(ChildText(c, "Size").c_str());
      absl::Time modified;
      std::string parse_error;
      if (absl::ParseTime(absl::RFC3339_full, ChildText(c, "LastModified"), &modified, &parse_error)) {
        info.modified = modified;
      }
      out.push_back(std::move(info));
    }
    const bool truncated = ChildText(result, "IsTruncated") == "true";
    token = ChildText(result, "NextContinuationToken");
    if (!truncated) break;
    if (token.empty()) {
      return InternalError("truncated ListObjectsV2 answer from s3://" + options_.bucket +
                           " without NextContinuationToken");
    }
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

std::string S3Store::url() const {
  std::string u = "s3://" + options_.bucket;
  if (!options_.prefix.empty()) u += "/" + options_.prefix;
  u += "?region=" + options_.region;
  if (!options_.endpoint.empty()) u += "&endpoint=" + options_.endpoint;
  if (options_.max_keys != 1000) u += "&max_keys=" + std::to_string(options_.max_keys);
  return u;
}

}  // namespace lede::storage
