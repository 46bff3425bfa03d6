#include "server/pool/staging.h"

#include <algorithm>

#include "kernels/common/status_macros.h"

namespace statecache {

absl::StatusOr<std::unique_ptr<BackendBuffer>> StageBytes(Backend& backend, const void* host,
                                                          int64_t bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> buffer,
                   backend.Allocate(std::max<int64_t>(bytes, 16)));
  if (bytes > 0) RETURN_IF_ERROR(backend.CopyIn(buffer->data(), host, bytes));
  return buffer;
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> StageInts(Backend& backend,
                                                         absl::Span<const int32_t> values) {
  return StageBytes(backend, values.data(), static_cast<int64_t>(values.size() * sizeof(int32_t)));
}

}  // namespace statecache
