#include "kernels/cpu/cpu_backend.h"

#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backend/batch_validation.h"
#include "kernels/common/status_macros.h"
#include "kernels/cpu/head_step.h"
#include "kernels/formats/head_codec.h"
#include "kernels/formats/value_transform.h"

namespace statecache {
namespace {

class CpuPreparedModel : public PreparedModel {
 public:
  explicit CpuPreparedModel(StateLayout layout) : layout_(std::move(layout)) {}
  const StateLayout& layout() const override { return layout_; }

 private:
  StateLayout layout_;
};

ValueMap MapOf(const StateLayout& layout, int layer, int head) {
  return ValueMap{layout.head_layout().transform, layout.value_order(layer, head),
                  layout.value_scale(layer, head)};
}

// The head codec of a layout: the uniform formats share one PackedHeadLayout;
// STEPQuant heads each have their own (StateLayout::step_head) and row-impact
// factors.
void DecodeStoredHead(const StateLayout& layout, int layer, int h, const uint8_t* head, float* w) {
  if (layout.head_offsets().empty()) {
    DecodeHead(layout.head_layout(), head, w);
  } else {
    StepDecodeHead(layout.step_head(layer, h), head, w);
  }
}

void EncodeStoredHead(const StateLayout& layout, int layer, int h, const float* w, uint8_t* head) {
  if (layout.head_offsets().empty()) {
    EncodeHead(layout.head_layout(), w, head);
  } else {
    StepEncodeHead(layout.step_head(layer, h), layout.row_impact(layer, h), w, head);
  }
}

// The pool with the layout's per-head offsets (host memory) when it has them.
PoolView HeadIndexed(const StateLayout& layout, const PoolView& pool) {
  PoolView v = pool;
  if (!layout.head_offsets().empty()) v.head_offsets = layout.head_offsets().data();
  return v;
}

// Per-thread working memory for one head.
struct HeadScratch {
  std::vector<float> w, q, k, g, v, o_stored, tmp;
  void Resize(int d_k, int d_v) {
    w.resize(static_cast<size_t>(d_k) * d_v);
    q.resize(d_k);
    k.resize(d_k);
    g.resize(d_k);
    v.resize(d_v);
    o_stored.resize(d_v);
    tmp.resize(d_v);
  }
};

HeadScratch& ThreadScratch(int d_k, int d_v) {
  thread_local HeadScratch scratch;
  scratch.Resize(d_k, d_v);
  return scratch;
}

// Inputs of one token for one value head, as typed pointers + offsets.
struct TokenView {
  DType dtype;
  const void* q;
  const void* k;
  const void* v;
  const float* g;
  const float* beta;
  int64_t qk_offset;  // element offset of this head's q/k
  int64_t v_offset;   // element offset of this head's v
  int64_t g_offset;   // element offset of this head's g
  int64_t beta_offset;
};

// Gathers one token's inputs into stored order and runs the step.
void RunToken(const ModelGeometry& geo, const int32_t* perm, const ValueMap& map,
              const TokenView& t, HeadScratch& s, float* o_out) {
  const float scale = geo.EffectiveScale();
  for (int r = 0; r < geo.d_k; ++r) {
    const int c = perm[r];
    s.q[r] = scale * LoadAsFloat(t.dtype, t.q, t.qk_offset + c);
    s.k[r] = LoadAsFloat(t.dtype, t.k, t.qk_offset + c);
    if (geo.arch == Arch::kKda) s.g[r] = t.g[t.g_offset + c];
  }
  if (geo.arch == Arch::kGdn) s.g[0] = t.g[t.g_offset];
  for (int j = 0; j < geo.d_v; ++j) s.tmp[j] = LoadAsFloat(t.dtype, t.v, t.v_offset + j);
  ValueToStored(map, s.tmp.data(), s.v.data(), geo.d_v);
  HeadStepInputs in{s.q.data(), s.k.data(), s.g.data(), t.beta[t.beta_offset], s.v.data()};
  HeadStep(geo.arch, geo.d_k, geo.d_v, in, s.w.data(), s.o_stored.data(), s.tmp.data());
  if (o_out != nullptr) ValueFromStored(map, s.o_stored.data(), o_out, geo.d_v);
}

}  // namespace

CpuBackend::CpuBackend(int threads)
    : threads_(threads), pinned_(std::make_unique<PlainHostMemory>()) {}

std::unique_ptr<CpuBackend> CpuBackend::Create(const Options& options) {
  const int threads = options.threads > 0 ? options.threads : ThreadPool::DefaultThreads();
  return std::unique_ptr<CpuBackend>(new CpuBackend(threads));
}

std::string CpuBackend::Describe() const {
  return absl::StrCat("cpu backend, ", threads_.threads(), " threads");
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> CpuBackend::Allocate(int64_t bytes) {
  // Backend memory is plain host memory: the same 256-byte-aligned blocks
  // as the pinned-memory capability, zeroed (Allocate's contract).
  ASSIGN_OR_RETURN(std::unique_ptr<BackendBuffer> b, pinned_->AllocatePinned(bytes));
  std::memset(b->data(), 0, static_cast<size_t>(std::max<int64_t>(256, (bytes + 255) / 256 * 256)));
  return b;
}

absl::StatusOr<int64_t> CpuBackend::AvailableBytes() const {
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages < 0 || page_size < 0) return absl::InternalError("sysconf failed");
  return int64_t{pages} * page_size;
}

absl::Status CpuBackend::CopyIn(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyOut(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyWithin(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PreparedModel>> CpuBackend::Prepare(const StateLayout& layout) {
  return std::unique_ptr<PreparedModel>(new CpuPreparedModel(layout));
}

absl::Status CpuBackend::DecodeUpdate(const PreparedModel& model, const PoolView& pool, int layer,
                                      const DecodeInputs& in) {
  const StateLayout& layout = model.layout();
  RETURN_IF_ERROR(ValidateDecodeInputs(layout, pool, layer, in));
  const ModelGeometry& geo = layout.geometry();
  const PoolView heads = HeadIndexed(layout, pool);
  threads_.ParallelFor(int64_t{in.batch} * geo.h_v, [&](int64_t item) {
    const int b = static_cast<int>(item / geo.h_v);
    const int h = static_cast<int>(item % geo.h_v);
    float* o = in.o + (int64_t{b} * geo.h_v + h) * geo.d_v;
    const int32_t slot = in.slots[b];
    if (slot < 0) {
      std::fill(o, o + geo.d_v, 0.0f);
      return;
    }
    HeadScratch& s = ThreadScratch(geo.d_k, geo.d_v);
    uint8_t* head = heads.head(slot, layer, h);
    DecodeStoredHead(layout, layer, h, head, s.w.data());
    const int kh = geo.KeyHeadOf(h);
    const TokenView t{in.dtype,
                      in.q,
                      in.k,
                      in.v,
                      in.g,
                      in.beta,
                      (int64_t{b} * geo.h_qk + kh) * geo.d_k,
                      (int64_t{b} * geo.h_v + h) * geo.d_v,
                      (int64_t{b} * geo.h_v + h) * geo.GateWidth(),
                      int64_t{b} * geo.h_v + h};
    RunToken(geo, layout.key_perm(layer, h), MapOf(layout, layer, h), t, s, o);
    EncodeStoredHead(layout, layer, h, s.w.data(), head);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Prefill(const PreparedModel& model, const PoolView& pool, int layer,
                                 const PrefillInputs& in) {
  const StateLayout& layout = model.layout();
  RETURN_IF_ERROR(ValidatePrefillInputs(layout, pool, layer, in));
  const ModelGeometry& geo = layout.geometry();
  const PoolView heads = HeadIndexed(layout, pool);
  threads_.ParallelFor(int64_t{in.batch} * geo.h_v, [&](int64_t item) {
    const int b = static_cast<int>(item / geo.h_v);
    const int h = static_cast<int>(item % geo.h_v);
    const int32_t slot = in.slots[b];
    auto o_at = [&](int t) -> float* {
      if (in.o == nullptr) return nullptr;
      return in.o + ((int64_t{b} * in.tokens + t) * geo.h_v + h) * geo.d_v;
    };
    if (slot < 0) {
      for (int t = 0; t < in.tokens && in.o != nullptr; ++t) std::fill(o_at(t), o_at(t) + geo.d_v, 0.0f);
      return;
    }
    HeadScratch& s = ThreadScratch(geo.d_k, geo.d_v);
    uint8_t* head = heads.head(slot, layer, h);
    DecodeStoredHead(layout, layer, h, head, s.w.data());
    const int kh = geo.KeyHeadOf(h);
    const int32_t* perm = layout.key_perm(layer, h);
    const ValueMap map = MapOf(layout, layer, h);
    for (int t = 0; t < in.tokens; ++t) {
      const int64_t row = int64_t{b} * in.tokens + t;
      const TokenView tv{in.dtype,
                         in.q,
                         in.k,
                         in.v,
                         in.g,
                         in.beta,
                         (row * geo.h_qk + kh) * geo.d_k,
                         (row * geo.h_v + h) * geo.d_v,
                         (row * geo.h_v + h) * geo.GateWidth(),
                         row * geo.h_v + h};
      RunToken(geo, perm, map, tv, s, o_at(t));
    }
    EncodeStoredHead(layout, layer, h, s.w.data(), head);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::PackStates(const PreparedModel& model, const PoolView& pool,
                                    const int32_t* slots, int n, const float* states) {
  const StateLayout& layout = model.layout();
  RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, 0));
  RETURN_IF_ERROR(ValidateSlots(pool, slots, n));
  const ModelGeometry& geo = layout.geometry();
  const int64_t head_values = int64_t{geo.d_k} * geo.d_v;
  const PoolView heads = HeadIndexed(layout, pool);
  RETURN_IF_ERROR(ValidateStateValues("states", states, n * geo.HeadsPerSlot() * head_values));
  threads_.ParallelFor(n * geo.HeadsPerSlot(), [&](int64_t item) {
    const int i = static_cast<int>(item / geo.HeadsPerSlot());
    const int lh = static_cast<int>(item % geo.HeadsPerSlot());
    const int layer = lh / geo.h_v, h = lh % geo.h_v;
    if (slots[i] < 0) return;
    HeadScratch& s = ThreadScratch(geo.d_k, geo.d_v);
    const float* src = states + item * head_values;
    const int32_t* perm = layout.key_perm(layer, h);
    const ValueMap map = MapOf(layout, layer, h);
    for (int r = 0; r < geo.d_k; ++r) {
      ValueToStored(map, src + int64_t{perm[r]} * geo.d_v, s.w.data() + int64_t{r} * geo.d_v,
                    geo.d_v);
    }
    EncodeStoredHead(layout, layer, h, s.w.data(), heads.head(slots[i], layer, h));
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::UnpackStates(const PreparedModel& model, const PoolView& pool,
                                      const int32_t* slots, int n, float* states) {
  const StateLayout& layout = model.layout();
  RETURN_IF_ERROR(ValidatePoolAndLayer(layout, pool, 0));
  RETURN_IF_ERROR(ValidateSlots(pool, slots, n));
  const ModelGeometry& geo = layout.geometry();
  const int64_t head_values = int64_t{geo.d_k} * geo.d_v;
  const PoolView heads = HeadIndexed(layout, pool);
  threads_.ParallelFor(n * geo.HeadsPerSlot(), [&](int64_t item) {
    const int i = static_cast<int>(item / geo.HeadsPerSlot());
    const int lh = static_cast<int>(item % geo.HeadsPerSlot());
    const int layer = lh / geo.h_v, h = lh % geo.h_v;
    float* dst = states + item * head_values;
    if (slots[i] < 0) {
      std::fill(dst, dst + head_values, 0.0f);
      return;
    }
    HeadScratch& s = ThreadScratch(geo.d_k, geo.d_v);
    DecodeStoredHead(layout, layer, h, heads.head(slots[i], layer, h), s.w.data());
    const int32_t* perm = layout.key_perm(layer, h);
    const ValueMap map = MapOf(layout, layer, h);
    for (int r = 0; r < geo.d_k; ++r) {
      ValueFromStored(map, s.w.data() + int64_t{r} * geo.d_v, dst + int64_t{perm[r]} * geo.d_v,
                      geo.d_v);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::CopySlots(const PoolView& src, const int32_t* src_slots,
                                   const PoolView& dst, const int32_t* dst_slots, int n) {
  if (src.slot_bytes() != dst.slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("pool: slot sizes differ (", src.slot_bytes(),
                                                   " vs ", dst.slot_bytes(), " bytes)"));
  }
  RETURN_IF_ERROR(ValidateSlots(src, src_slots, n));
  RETURN_IF_ERROR(ValidateSlots(dst, dst_slots, n));
  for (int i = 0; i < n; ++i) {
    if (src_slots[i] < 0 || dst_slots[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("slots[", i, "]: -1 is not allowed in a copy"));
    }
  }
  threads_.ParallelFor(n, [&](int64_t i) {
    std::memcpy(dst.slot(dst_slots[i]), src.slot(src_slots[i]),
                static_cast<size_t>(src.slot_bytes()));
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ZeroSlots(const PoolView& pool, const int32_t* slots, int n) {
  RETURN_IF_ERROR(ValidateSlots(pool, slots, n));
  for (int i = 0; i < n; ++i) {
    if (slots[i] >= 0) std::memset(pool.slot(slots[i]), 0, static_cast<size_t>(pool.slot_bytes()));
  }
  return absl::OkStatus();
}

}  // namespace statecache
