// File: shared/status/status_macros.h
//
// LEDE_RETURN_IF_ERROR(expr): evaluates expr (a lede::Status) and returns it
// from the enclosing function if it is not OK.
// LEDE_ASSIGN_OR_RETURN(lhs, expr): evaluates expr (a lede::StatusOr<T>);
// on error returns its status, else move-assigns the value to lhs, which may
// be a declaration (`auto x`).
//
// Named so they can become ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN once
// the Abseil we build against ships them (20220623 does not).
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(auto config, ParseHfConfig(text, path));
//   LEDE_RETURN_IF_ERROR(config.Validate());
#ifndef LEDE_SHARED_STATUS_STATUS_MACROS_H_
#define LEDE_SHARED_STATUS_STATUS_MACROS_H_

#include "shared/status/status.h"

#define LEDE_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::lede::Status lede_status_ = (expr);          \
    if (!lede_status_.ok()) return lede_status_;   \
  } while (0)

#define LEDE_STATUS_CONCAT_INNER_(a, b) a##b
#define LEDE_STATUS_CONCAT_(a, b) LEDE_STATUS_CONCAT_INNER_(a, b)

#define LEDE_ASSIGN_OR_RETURN(lhs, expr) \
  LEDE_ASSIGN_OR_RETURN_IMPL_(LEDE_STATUS_CONCAT_(lede_statusor_, __LINE__), lhs, expr)

#define LEDE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) return statusor.status();           \
  lhs = std::move(statusor).value()

#endif  // LEDE_SHARED_STATUS_STATUS_MACROS_H_
