// File: shared/storage/s3_store.h
//
// S3Store: an ObjectStore on an S3-compatible bucket (AWS S3, MinIO, Ceph,
// s3rver), over HTTP(S) with libcurl and AWS Signature Version 4 (libcurl's
// CURLOPT_AWS_SIGV4, service "s3"; the payload hash goes in
// x-amz-content-sha256). Used by the coordinator to log experience and by
// the trainer and policy service in deployments of more than one machine
// (docs/design.md §3).
//
// Addressing: with an endpoint, path style "<endpoint>/<bucket>/<key>";
// without one, AWS virtual-host style
// "https://<bucket>.s3.<region>.amazonaws.com/<key>". Object keys are
// "<prefix>/<key>" in the bucket; keys are URI-encoded as SigV4 canonical
// URIs (RFC 3986 unreserved characters and '/' kept).
#ifndef LEDE_SHARED_STORAGE_S3_STORE_H_
#define LEDE_SHARED_STORAGE_S3_STORE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "shared/status/status.h"
#include "shared/storage/object_store.h"

namespace lede::storage {

// Where and as whom to reach the bucket. OpenObjectStore() fills these from
// the URL and the environment.
//
// Example:
//   S3Options o;
//   o.bucket = "lede-test";
//   o.prefix = "run1";
//   o.endpoint = "http://127.0.0.1:4569";   // s3rver or MinIO
//   o.access_key_id = o.secret_access_key = "S3RVER";
struct S3Options {
  std::string bucket;  // bucket name, 3..63 of [a-z0-9.-]
  // Key prefix inside the bucket, without leading or trailing '/'; "" for
  // the whole bucket. Key k is stored as "<prefix>/<k>".
  std::string prefix;
  // "http[s]://host[:port]" (no path) for path-style addressing; "" for AWS
  // (virtual-host style, always https).
  std::string endpoint;
  std::string region = "us-east-1";  // the SigV4 signing region
  // Credentials; both empty sends unsigned (anonymous) requests.
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // sent as x-amz-security-token when non-empty
  // ListObjectsV2 page size (max-keys), 1..1000; smaller pages cost more
  // requests (tests use 2 to exercise pagination).
  int max_keys = 1000;
  absl::Duration connect_timeout = absl::Seconds(5);   // TCP/TLS connect limit
  absl::Duration request_timeout = absl::Seconds(60);  // whole-request limit
};

// HTTP status mapping: 404 → kNotFound; 401/403 → kPermissionDenied; 400 →
// kInvalidArgument; 409/412 → kFailedPrecondition; 429, 5xx and transport
// failures (refused connection, DNS, TLS, timeout) → kUnavailable; anything
// else unexpected → kInternal. Messages carry the method, the object, the
// HTTP status and S3's error Code and Message.
// Thread-safety: thread-safe; each call uses its own curl handle (no
// connection reuse between calls).
class S3Store : public ObjectStore {
 public:
  // Checks the options (nothing is contacted). Errors: kInvalidArgument for
  // a bad bucket name, prefix, endpoint or max_keys, or only one of the two
  // keys.
  static StatusOr<std::unique_ptr<S3Store>> Create(S3Options options);

  Status Put(std::string_view key, std::string_view bytes) override;
  StatusOr<std::string> Get(std::string_view key) override;
  StatusOr<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  // "s3://bucket[/prefix]?region=R[&endpoint=E][&max_keys=N]".
  std::string url() const override;

  const S3Options& options() const { return options_; }

 private:
  explicit S3Store(S3Options options) : options_(std::move(options)) {}
  S3Options options_;
};

// Encodes `s` the way SigV4 canonical requests do: RFC 3986 unreserved
// characters (A-Z a-z 0-9 - _ . ~) stay, every other byte becomes %XX
// (uppercase hex); '/' stays too when `keep_slash` (object paths) and is
// encoded otherwise (query values).
std::string SigV4Encode(std::string_view s, bool keep_slash);

}  // namespace lede::storage

#endif  // LEDE_SHARED_STORAGE_S3_STORE_H_
