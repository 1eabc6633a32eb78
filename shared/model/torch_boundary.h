// File: shared/model/torch_boundary.h
//
// The torch boundary: the one place where exceptions thrown by libtorch (and
// by the standard library inside torch glue) become lede::Status values
// (STYLE.md §2.6). Every Status- or StatusOr-returning function that calls
// libtorch runs its body through TorchBoundary() once, at its top.
//
// Mapping (the message keeps what the exception said, prefixed by `what`):
//   std::bad_alloc, c10::OutOfMemoryError  -> kResourceExhausted
//   c10::Error (TORCH_CHECK, INTERNAL_ASSERT) -> kInternal, what_without_backtrace()
//   any other std::exception                 -> kInternal, what()
//   anything else                            -> kInternal, "unknown exception"
//
// This header is torch-free (the classification lives in torch_boundary.cc,
// part of lede::model), so torch-free headers may include it; code that
// uses it links lede::model.
//
// Example:
//   StatusOr<at::Tensor> Verifier::Step(...) {
//     return TorchBoundary("step", [&]() -> StatusOr<at::Tensor> { ... });
//   }
//
// Thread-safety: stateless; safe from any thread.
#ifndef LEDE_SHARED_MODEL_TORCH_BOUNDARY_H_
#define LEDE_SHARED_MODEL_TORCH_BOUNDARY_H_

#include <string_view>

#include "shared/status/status.h"

namespace lede::model {

// The Status for the exception being handled, per the mapping above. Call it
// only inside a catch block. Message: "<what>: <exception message>".
Status StatusFromCurrentException(std::string_view what);

// Runs `fn` (returning Status or StatusOr<T>) and returns its result, or the
// Status of any exception it throws. `what` names the operation, e.g. the
// file or the step ("prefill", "/models/x"); an empty `what` adds no prefix.
template <typename Fn>
auto TorchBoundary(std::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (...) {
    return StatusFromCurrentException(what);
  }
}

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_TORCH_BOUNDARY_H_
