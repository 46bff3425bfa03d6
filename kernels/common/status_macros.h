// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status code.
//
// Debian's Abseil (20220623) ships no status_macros.h, so statecache keeps
// this one small header. Usage:
//
//   absl::Status Load() {
//     RETURN_IF_ERROR(Validate());
//     ASSIGN_OR_RETURN(auto file, Open(path));
//     ...
//   }
#ifndef STATECACHE_KERNELS_COMMON_STATUS_MACROS_H_
#define STATECACHE_KERNELS_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SC_STATUS_CONCAT_INNER(a, b) a##b
#define SC_STATUS_CONCAT(a, b) SC_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status); returns it from the caller if not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    const ::absl::Status sc_status_ = (expr);          \
    if (!sc_status_.ok()) return sc_status_;           \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status from the caller
// if not OK, else moves the value into `lhs` (a declaration or an lvalue).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  SC_ASSIGN_OR_RETURN_IMPL(SC_STATUS_CONCAT(sc_statusor_, __LINE__), lhs, rexpr)

#define SC_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                             \
  if (!statusor.ok()) return statusor.status();        \
  lhs = std::move(statusor).value()

#endif  // STATECACHE_KERNELS_COMMON_STATUS_MACROS_H_
