// The data plane's Update and Prefill: DataPlane::BufferSource, the
// ops::TensorSource of registered buffers, and the adapters that run the
// operations layer's sequence over it (server/ops/state_ops.h).

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/common/status_macros.h"
#include "server/dataplane/data_plane.h"
#include "server/ops/checks.h"
#include "server/ops/state_ops.h"
#include "server/ops/tensor_source.h"
#include "server/pool/staging.h"
#include "server/core/proto_convert.h"

namespace statecache {

// The registered-buffer TensorSource: tensors are BufferRefs into the
// caller's registered buffers or inline bytes staged into backend memory.
class DataPlane::BufferSource final : public ops::TensorSource {
 public:
  // `before_read` (may be null: wait for the input buffers' worker events and
  // publish o's write with the server event) is used during the call only.
  BufferSource(DataPlane* plane, const std::string& tenant,
               const std::function<absl::Status()>* before_read)
      : plane_(plane), tenant_(tenant), before_read_(before_read) {}

  absl::Status CheckSanitize(bool sanitize, absl::string_view prefix) override {
    if (!sanitize) return absl::OkStatus();
    if (prefix.empty()) {
      return absl::InvalidArgumentError(
          "sanitize_non_finite: not supported with registered buffers (the inputs are rejected "
          "with INVALID_ARGUMENT when not finite)");
    }
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "sanitize_non_finite: not supported with registered buffers"));
  }
  absl::StatusOr<ops::SourcedTensor> Input(const v1::Tensor& t, absl::string_view field,
                                           absl::Span<const DType> allowed,
                                           absl::Span<const int64_t> shape) override {
    ASSIGN_OR_RETURN(Resolved r, plane_->Resolve(tenant_, t, field, allowed, shape));
    inputs_.push_back(std::move(r));
    return View(inputs_.back());
  }
  absl::StatusOr<ops::SourcedTensor> Output(const v1::BufferRef* ref, absl::string_view field,
                                            int64_t count, v1::Tensor*) override {
    ASSIGN_OR_RETURN(output_, plane_->ResolveOutput(
                                  tenant_, ref != nullptr,
                                  ref != nullptr ? *ref : v1::BufferRef::default_instance(),
                                  field, count));
    return View(output_);
  }
  absl::Status Ready(const ops::Context& ctx, absl::string_view prefix, bool, int d_k,
                     ops::ComputeTensors*, int64_t*) override {
    if (before_read_ != nullptr) {
      RETURN_IF_ERROR((*before_read_)());
    } else {
      // Distinct referenced buffers: wait for the worker's writes.
      std::vector<Buffer*> done;
      for (const Resolved& r : inputs_) {
        Buffer* b = r.buffer.get();
        if (b == nullptr || std::find(done.begin(), done.end(), b) != done.end()) continue;
        RETURN_IF_ERROR(b->BeforeRead());
        done.push_back(b);
      }
    }
    return plane_->HostValueCheck(ctx.limits, prefix, inputs_[0], inputs_[1], inputs_[2], d_k);
  }
  absl::StatusOr<ops::Launch> RunUpdate(const ops::Context& ctx, Model& m, int layer,
                                        const std::vector<int32_t>& slots,
                                        const ops::ComputeTensors& t) override {
    DecodeInputs in;
    RETURN_IF_ERROR(Stage(slots, t, &in));
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(ctx.backend->DecodeUpdate(*m.prepared, m.slots->view(), layer, in));
    return LaunchOf(start, in.batch);
  }
  absl::StatusOr<ops::Launch> RunPrefill(const ops::Context& ctx, Model& m, int layer, int tokens,
                                         const std::vector<int32_t>& slots,
                                         const ops::ComputeTensors& t) override {
    PrefillInputs in;
    RETURN_IF_ERROR(Stage(slots, t, &in));
    in.tokens = tokens;
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(ctx.backend->Prefill(*m.prepared, m.slots->view(), layer, in));
    return LaunchOf(start, in.batch);
  }
  absl::Status Finish(const ops::ComputeTensors&, const v1::BufferRef* ref,
                      v1::Tensor* out) override {
    if (output_.buffer != nullptr) {
      *out->mutable_ref() = *ref;
      return before_read_ == nullptr ? output_.buffer->AfterWrite() : absl::OkStatus();
    }
    std::string* data = out->mutable_data();
    data->resize(output_.bytes);
    return plane_->backend_->CopyOut(data->data(), output_.data, output_.bytes);
  }

  // Slot indices staged (cached by value) and the resolved tensors, as
  // backend inputs: DecodeInputs or PrefillInputs (tokens left to the caller).
  template <typename Inputs>
  absl::Status Stage(const std::vector<int32_t>& slots, const ops::ComputeTensors& t,
                     Inputs* in) {
    ASSIGN_OR_RETURN(idx_, plane_->StagedIndices(slots));
    in->batch = static_cast<int>(slots.size());
    in->slots = StagedData<int32_t>(*idx_);
    in->dtype = t.q.dtype;
    in->q = t.q.data;
    in->k = t.k.data;
    in->v = t.v.data;
    in->g = static_cast<const float*>(t.g.data);
    in->beta = static_cast<const float*>(t.beta.data);
    in->o = static_cast<float*>(t.o.data);
    return absl::OkStatus();
  }

 private:
  static ops::SourcedTensor View(const Resolved& r) {
    const int64_t width = DTypeSize(r.dtype);
    return ops::SourcedTensor{r.dtype, r.data, r.bytes / width, r.bytes};
  }
  static ops::Launch LaunchOf(absl::Time start, int batch) {
    ops::Launch launch;
    launch.kernel_seconds = SecondsSince(start);
    launch.batch = batch;
    return launch;
  }

  DataPlane* const plane_;
  const std::string tenant_;
  const std::function<absl::Status()>* const before_read_;
  std::deque<Resolved> inputs_;  // q, k, v, g, beta
  Resolved output_;
  std::shared_ptr<BackendBuffer> idx_;
};

ops::Context DataPlane::OpsContext(const ops::Limits& limits,
                                   const KernelObserver& observe) const {
  ops::Context ctx;
  ctx.backend = backend_;
  ctx.limits = limits;
  ctx.observe = observe;
  ctx.not_attached = [this](const Model& m, absl::Span<const SlotHandle> handles,
                            absl::string_view field) {
    return CheckNotAttached(m, handles, field);
  };
  return ctx;
}

absl::Status DataPlane::Update(const std::string& tenant, Model& m, const v1::UpdateRequest& req,
                               const ops::Limits& limits, const KernelObserver& observe,
                               v1::UpdateResponse* resp) {
  return UpdateImpl(tenant, m, req, limits, observe, nullptr, resp);
}

absl::Status DataPlane::UpdateImpl(const std::string& tenant, Model& m,
                                   const v1::UpdateRequest& req, const ops::Limits& limits,
                                   const KernelObserver& observe,
                                   const std::function<absl::Status()>* before_read,
                                   v1::UpdateResponse* resp) {
  BufferSource source(this, tenant, before_read);
  return ops::Update(OpsContext(limits, observe), source, m, req, resp);
}

absl::Status DataPlane::PlanUpdate(const std::string& tenant, Model& m,
                                   const v1::UpdateRequest& req, const ops::Limits& limits,
                                   const std::function<absl::Status()>* before_read,
                                   HeldSlots* held, UpdatePlan* plan) {
  plan->source = std::make_shared<BufferSource>(this, tenant, before_read);
  ops::ComputeTensors t;
  v1::UpdateResponse unused;
  RETURN_IF_ERROR(
      ops::PrepareUpdate(OpsContext(limits, nullptr), *plan->source, m, req, &t, &unused));
  std::vector<SlotHandle> handles = HandlesFromProto(req.slots());
  RETURN_IF_ERROR(CheckNotAttached(m, handles, "slots"));
  if (held != nullptr && held->model == &m && held->handles == handles) {
    // The stream's previous update on these slots is still in flight, so
    // they are still busy (held by it) and its handles still valid: the new
    // update shares that access (ordered after it on the same queue).
    plan->access = held->access.lock();
  }
  if (plan->access == nullptr) {
    ASSIGN_OR_RETURN(SlotPool::SlotAccess access, m.slots->Acquire(handles, "slots"));
    plan->access = std::make_shared<SlotPool::SlotAccess>(std::move(access));
    if (held != nullptr) {
      held->model = &m;
      held->handles = std::move(handles);
      held->access = plan->access;
    }
  }
  return plan->source->Stage(plan->access->indices(), t, &plan->in);
}

absl::Status DataPlane::Prefill(const std::string& tenant, Model& m, const v1::PrefillRequest& req,
                                const ops::Limits& limits, const KernelObserver& observe,
                                v1::PrefillResponse* resp) {
  RETURN_IF_ERROR(CheckBatch(req.slots_size(), limits.max_batch, "slots"));
  if (req.input_case() != v1::PrefillRequest::kTokens) {
    return absl::InvalidArgumentError(
        "states.ref: a Prefill of states takes inline bytes only (use tokens with references)");
  }
  BufferSource source(this, tenant, nullptr);
  return ops::PrefillTokens(OpsContext(limits, observe), source, m, req, resp);
}

}  // namespace statecache
