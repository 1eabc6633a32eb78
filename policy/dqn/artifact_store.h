// File: policy/dqn/artifact_store.h
//
// Policy artifacts published through an object store (shared/storage), so
// that a trainer and the policy services of many machines share no file
// system (a Kubernetes CronJob and Deployments with S3/MinIO between them;
// docs/design.md §3 "object store"). The store holds the local layout of
// artifact.h under its URL's root:
//   <version>/policy.safetensors, <version>/policy.json
//   (and any other file of the version directory, e.g. the trainer's report.json), SERVING
// Publishing uploads the version's files, policy.json last, then SERVING;
// each Put is atomic (object_store.h). So a reader that follows SERVING
// either finds every file of the version it names, or a missing policy.json
// (an upload in progress: kNotFound, retried on the next poll), never a
// half-written file; a policy.json whose weights_sha256 does not match the
// weights it finds (a version re-uploaded over itself) fails validation.
//
// Readers keep a local mirror: a policy root on local disk holding the
// versions they downloaded and their own SERVING. A version is downloaded
// into a hidden temporary directory, validated (LoadArtifact) and renamed
// into place, so the mirror holds only whole, valid versions, and every
// local reader (ServingPolicy, the drafter's --policy-dir) works unchanged.
//
// Thread-safety: free functions; one mirror directory must have one writer
// (the policy service's reload thread), like the local root has one trainer.
// Torch-free.
#ifndef LEDE_POLICY_DQN_ARTIFACT_STORE_H_
#define LEDE_POLICY_DQN_ARTIFACT_STORE_H_

#include <string>

#include "shared/status/status.h"
#include "shared/storage/object_store.h"

namespace lede::policy::dqn {

// Uploads local_root/<version> (which must load with `expected_fingerprint`)
// to `store`, policy.json after the weights; then, when `set_serving`,
// points the store's SERVING at it.
// Errors: those of ValidateVersionName and LoadArtifact (nothing uploaded);
// the store's (kUnavailable, kPermissionDenied, ...): SERVING is written
// only after every file, so a failed upload is never served.
Status UploadVersion(storage::ObjectStore& store, const std::string& local_root, const std::string& version,
                     bool set_serving, const std::string& expected_fingerprint = "");

// Makes `mirror_root` serve what the store's SERVING names: downloads that
// version unless the mirror already has it, validates it, and points the
// mirror's SERVING at it. Returns the version.
// Errors (the mirror's SERVING unchanged): kNotFound when the store has no
// SERVING or the version lacks a file (an unfinished upload); kInvalidArgument
// for an invalid version name or an artifact that fails validation; the
// store's errors; kInternal on local I/O failure.
StatusOr<std::string> MirrorServingVersion(storage::ObjectStore& store, const std::string& mirror_root,
                                           const std::string& expected_fingerprint = "");

}  // namespace lede::policy::dqn

#endif  // LEDE_POLICY_DQN_ARTIFACT_STORE_H_
