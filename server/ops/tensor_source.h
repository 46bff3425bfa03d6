// TensorSource: where the tensors of an Update or a Prefill of tokens live,
// behind the one request path of server/ops (ops::Update, ops::Prefill).
//
// The operation owns the sequence: bounds (layer, batch, work), options the
// source cannot honour, the inputs q, k, v, g, beta and the output o
// resolved in request order, the source's readiness and value contract, the
// attached-slot check, the slot access, the launch, the output, metrics.
// A source owns what differs with the memory the tensors are in:
//   - RequestBytes (below): inline bytes of the message, checked on the
//     host (finite, L2-normalized q / k, bounded |v|, gates; optional
//     sanitizing) and run through server/core/host_update.h or the coalescer;
//   - the data plane's registered buffers (server/dataplane/data_plane.cc):
//     references resolved against the caller's buffers, the worker's event
//     waited for, o published to the worker after the write.
// A source serves one request and is not thread-safe.
#ifndef STATECACHE_SERVER_OPS_TENSOR_SOURCE_H_
#define STATECACHE_SERVER_OPS_TENSOR_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/backend/backend.h"
#include "proto/statecache/v1/statecache.pb.h"
#include "server/core/model_registry.h"
#include "server/ops/context.h"

namespace statecache {
namespace ops {

// One resolved tensor: `data` is where the source's Run reads or writes it.
struct SourcedTensor {
  DType dtype = DType::kFp32;
  void* data = nullptr;
  int64_t count = 0;  // elements
  int64_t bytes = 0;
};

// The tensors of one Update ([B, ...]) or Prefill of tokens ([B, T, ...]),
// shapes as in the proto; o.data is null when no output is wanted.
struct ComputeTensors {
  SourcedTensor q, k, v, g, beta, o;
};

// What one launch did: its backend wall time, its slots (every merged call's
// when coalesced) and whether this call reports it (once per launch).
struct Launch {
  double kernel_seconds = 0;
  int batch = 0;
  bool leader = true;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // kInvalidArgument when the request asks to sanitize NaN / Inf and the
  // source cannot (the field is prefix + "sanitize_non_finite").
  virtual absl::Status CheckSanitize(bool sanitize, absl::string_view prefix) = 0;
  // An input with a dtype in `allowed` and exactly `shape`; kInvalidArgument
  // naming `field` (".dtype", ".shape", ".data", ".ref") otherwise.
  virtual absl::StatusOr<SourcedTensor> Input(const v1::Tensor& t, absl::string_view field,
                                              absl::Span<const DType> allowed,
                                              absl::Span<const int64_t> shape) = 0;
  // Where o (`count` FP32 values) goes: the registered buffer `ref` names
  // (null: none), else memory of the source's choosing, copied into `out`.
  virtual absl::StatusOr<SourcedTensor> Output(const v1::BufferRef* ref, absl::string_view field,
                                               int64_t count, v1::Tensor* out) = 0;
  // Once every tensor is resolved and before any slot is touched: waits for
  // the inputs' producer and applies the value contract; with `sanitize`
  // replaces NaN / Inf by 0 first, counting them into *sanitized. Errors
  // name prefix + field.
  virtual absl::Status Ready(const Context& ctx, absl::string_view prefix, bool sanitize, int d_k,
                             ComputeTensors* t, int64_t* sanitized) = 0;
  // Runs on held slots (`slots`: their arena indices, held by the caller).
  virtual absl::StatusOr<Launch> RunUpdate(const Context& ctx, Model& m, int layer,
                                           const std::vector<int32_t>& slots,
                                           const ComputeTensors& t) = 0;
  virtual absl::StatusOr<Launch> RunPrefill(const Context& ctx, Model& m, int layer, int tokens,
                                            const std::vector<int32_t>& slots,
                                            const ComputeTensors& t) = 0;
  // After a run: o into `out` (bytes, or `ref` and the write published).
  virtual absl::Status Finish(const ComputeTensors& t, const v1::BufferRef* ref,
                              v1::Tensor* out) = 0;
};

// The inline bytes of a request (see above). Inputs point into the message,
// which must outlive the source.
class RequestBytes final : public TensorSource {
 public:
  absl::Status CheckSanitize(bool, absl::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<SourcedTensor> Input(const v1::Tensor& t, absl::string_view field,
                                      absl::Span<const DType> allowed,
                                      absl::Span<const int64_t> shape) override;
  // o is written straight into `out`'s bytes.
  absl::StatusOr<SourcedTensor> Output(const v1::BufferRef* ref, absl::string_view field,
                                       int64_t count, v1::Tensor* out) override;
  absl::Status Ready(const Context& ctx, absl::string_view prefix, bool sanitize, int d_k,
                     ComputeTensors* t, int64_t* sanitized) override;
  // Update: in place on a host-memory backend, else through the context's
  // staging cache (server/core/host_update.h), or merged by its coalescer.
  absl::StatusOr<Launch> RunUpdate(const Context& ctx, Model& m, int layer,
                                   const std::vector<int32_t>& slots,
                                   const ComputeTensors& t) override;
  // Prefill: every array staged into one buffer, o copied out after.
  absl::StatusOr<Launch> RunPrefill(const Context& ctx, Model& m, int layer, int tokens,
                                    const std::vector<int32_t>& slots,
                                    const ComputeTensors& t) override;
  absl::Status Finish(const ComputeTensors&, const v1::BufferRef*, v1::Tensor*) override {
    return absl::OkStatus();
  }

 private:
  // Sanitized copies of q, k, v and aligned copies of g and beta.
  std::string q_clean_, k_clean_, v_clean_;
  std::vector<float> gates_, betas_;
};

}  // namespace ops
}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_TENSOR_SOURCE_H_
