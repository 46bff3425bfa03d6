// HostStaging: host data staged into one backend buffer taken from a
// StagingCache (contents not zeroed), section by section, each section
// 256-byte aligned. Private to server/ops.
//
//   HostStaging st;
//   const int s_idx = st.Add(indices.data(), b * sizeof(int32_t));
//   const int s_out = st.Add(nullptr, out_bytes);  // reserved, not copied
//   RETURN_IF_ERROR(st.Commit(backend, cache));
//   backend.Run(st.at<int32_t>(s_idx), st.at<float>(s_out));
#ifndef STATECACHE_SERVER_OPS_HOST_STAGING_H_
#define STATECACHE_SERVER_OPS_HOST_STAGING_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend/backend.h"
#include "kernels/common/status_macros.h"
#include "server/pool/staging_cache.h"

namespace statecache {
namespace ops {

class HostStaging {
 public:
  // Reserves a section of `bytes`; Commit copies `host` into it when
  // non-null. Returns the section index.
  int Add(const void* host, int64_t bytes) {
    parts_.push_back({host, bytes, total_});
    total_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return static_cast<int>(parts_.size()) - 1;
  }
  // Takes the buffer and copies every section with host data into it.
  absl::Status Commit(Backend& backend, StagingCache& cache) {
    ASSIGN_OR_RETURN(StagingCache::Lease lease, cache.Get(std::max<int64_t>(total_, kAlign)));
    buffer_.emplace(std::move(lease));
    for (const Part& p : parts_) {
      if (p.host != nullptr && p.bytes > 0) {
        RETURN_IF_ERROR(backend.CopyIn(buffer_->data() + p.offset, p.host, p.bytes));
      }
    }
    return absl::OkStatus();
  }
  // Backend address of section `part` (after Commit).
  template <typename T>
  T* at(int part) const {
    return reinterpret_cast<T*>(buffer_->data() + parts_[part].offset);
  }

 private:
  static constexpr int64_t kAlign = 256;
  struct Part {
    const void* host;
    int64_t bytes;
    int64_t offset;
  };
  std::vector<Part> parts_;
  int64_t total_ = 0;
  std::optional<StagingCache::Lease> buffer_;
};

}  // namespace ops
}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_HOST_STAGING_H_
