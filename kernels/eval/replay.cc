#include "kernels/eval/replay.h"

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace statecache {
namespace {

// A one-slot pool on the backend for `layout`.
struct OneSlotPool {
  std::unique_ptr<BackendBuffer> buffer;
  std::unique_ptr<BackendBuffer> slot_index;  // int32 {0} in backend memory
  std::unique_ptr<PreparedModel> model;
  PoolView view;
};

absl::StatusOr<OneSlotPool> MakePool(Backend& backend, const StateLayout& layout) {
  OneSlotPool p;
  ASSIGN_OR_RETURN(p.buffer, backend.Allocate(layout.slot_bytes()));
  ASSIGN_OR_RETURN(p.slot_index, backend.Allocate(sizeof(int32_t)));
  ASSIGN_OR_RETURN(p.model, backend.Prepare(layout));
  p.view = PoolView{p.buffer->data(), 1, layout.geometry().layers, layout.geometry().h_v,
                    layout.head_layout().head_bytes};
  return p;
}

// Backend-resident copies of one layer's inputs for a token range.
struct StagedTokens {
  std::unique_ptr<BackendBuffer> q, k, v, g, beta, o;
};

absl::StatusOr<std::unique_ptr<BackendBuffer>> Stage(Backend& backend, const float* data,
                                                     int64_t count) {
  ASSIGN_OR_RETURN(auto buf, backend.Allocate(count * 4));
  if (data != nullptr) RETURN_IF_ERROR(backend.CopyIn(buf->data(), data, count * 4));
  return buf;
}

double SquaredDiff(const std::vector<float>& a, const std::vector<float>& b, double* ref2) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double{a[i]} - b[i];
    e += d * d;
    *ref2 += double{b[i]} * b[i];
  }
  return e;
}

}  // namespace

absl::StatusOr<ReplayResult> ReplayAgainstFp32(Backend& backend, const StateLayout& layout,
                                               const std::vector<Trajectory>& trajectories,
                                               const ReplayOptions& options) {
  const ModelGeometry& geo = layout.geometry();
  ASSIGN_OR_RETURN(StateLayout fp32_layout, StateLayout::Identity(geo, FormatSpec{StateFormat::kFp32, 0}));
  ReplayResult result;
  result.layers.resize(geo.layers);
  const int64_t qk_row = int64_t{geo.h_qk} * geo.d_k, v_row = int64_t{geo.h_v} * geo.d_v;
  const int64_t g_row = int64_t{geo.h_v} * geo.GateWidth();
  const int64_t state_values = geo.HeadsPerSlot() * geo.d_k * geo.d_v;
  for (const Trajectory& traj : trajectories) {
    RETURN_IF_ERROR(traj.Validate());
    if (traj.geometry != geo) {
      return absl::InvalidArgumentError(absl::StrCat("trajectory: geometry ", traj.geometry.DebugString(),
                                                     " does not match the layout's ", geo.DebugString()));
    }
    ASSIGN_OR_RETURN(OneSlotPool test, MakePool(backend, layout));
    ASSIGN_OR_RETURN(OneSlotPool ref, MakePool(backend, fp32_layout));
    const int32_t zero = 0;
    RETURN_IF_ERROR(backend.CopyIn(test.slot_index->data(), &zero, 4));
    RETURN_IF_ERROR(backend.CopyIn(ref.slot_index->data(), &zero, 4));
    const auto* slot = reinterpret_cast<const int32_t*>(test.slot_index->data());
    ASSIGN_OR_RETURN(auto states_dev, backend.Allocate(state_values * 4));
    std::vector<float> s_test(state_values), s_ref(state_values);
    auto sample_states = [&](int layer) -> absl::Status {
      RETURN_IF_ERROR(backend.UnpackStates(*test.model, test.view, slot, 1,
                                           reinterpret_cast<float*>(states_dev->data())));
      RETURN_IF_ERROR(backend.CopyOut(s_test.data(), states_dev->data(), state_values * 4));
      RETURN_IF_ERROR(backend.UnpackStates(*ref.model, ref.view, slot, 1,
                                           reinterpret_cast<float*>(states_dev->data())));
      RETURN_IF_ERROR(backend.CopyOut(s_ref.data(), states_dev->data(), state_values * 4));
      // Only this layer's heads changed; compare them.
      const int64_t per_layer = int64_t{geo.h_v} * geo.d_k * geo.d_v;
      std::vector<float> a(s_test.begin() + layer * per_layer, s_test.begin() + (layer + 1) * per_layer);
      std::vector<float> b(s_ref.begin() + layer * per_layer, s_ref.begin() + (layer + 1) * per_layer);
      ErrorSums& e = result.layers[layer];
      e.state_err2 += SquaredDiff(a, b, &e.state_ref2);
      return absl::OkStatus();
    };
    for (int layer = 0; layer < geo.layers; ++layer) {
      const LayerInputs& in = traj.layers[layer];
      const int prefill = std::min(options.prefill_tokens, traj.tokens);
      ASSIGN_OR_RETURN(auto q, Stage(backend, in.q.data(), in.q.size()));
      ASSIGN_OR_RETURN(auto k, Stage(backend, in.k.data(), in.k.size()));
      ASSIGN_OR_RETURN(auto v, Stage(backend, in.v.data(), in.v.size()));
      ASSIGN_OR_RETURN(auto g, Stage(backend, in.g.data(), in.g.size()));
      ASSIGN_OR_RETURN(auto beta, Stage(backend, in.beta.data(), in.beta.size()));
      ASSIGN_OR_RETURN(auto o_test, Stage(backend, nullptr, int64_t{traj.tokens} * v_row));
      ASSIGN_OR_RETURN(auto o_ref, Stage(backend, nullptr, int64_t{traj.tokens} * v_row));
      auto f = [](const std::unique_ptr<BackendBuffer>& b, int64_t off) {
        return reinterpret_cast<float*>(b->data()) + off;
      };
      // Both pools advance in lock step so sampled states are at equal tokens.
      for (OneSlotPool* p : {&test, &ref}) {
        if (prefill == 0) break;
        PrefillInputs pin{1, prefill, slot, DType::kFp32, f(q, 0), f(k, 0), f(v, 0), f(g, 0),
                          f(beta, 0), p == &test ? f(o_test, 0) : f(o_ref, 0)};
        RETURN_IF_ERROR(backend.Prefill(*p->model, p->view, layer, pin));
      }
      for (int t = prefill; t < traj.tokens; ++t) {
        for (OneSlotPool* p : {&test, &ref}) {
          DecodeInputs din{1, slot, DType::kFp32, f(q, t * qk_row), f(k, t * qk_row),
                           f(v, t * v_row), f(g, t * g_row), f(beta, t * int64_t{geo.h_v}),
                           (p == &test ? f(o_test, 0) : f(o_ref, 0)) + t * v_row};
          RETURN_IF_ERROR(backend.DecodeUpdate(*p->model, p->view, layer, din));
        }
        if ((t + 1) % options.state_sample_every == 0) RETURN_IF_ERROR(sample_states(layer));
      }
      std::vector<float> ot(int64_t{traj.tokens} * v_row), orf(ot.size());
      RETURN_IF_ERROR(backend.CopyOut(ot.data(), o_test->data(), ot.size() * 4));
      RETURN_IF_ERROR(backend.CopyOut(orf.data(), o_ref->data(), orf.size() * 4));
      ErrorSums& e = result.layers[layer];
      e.out_err2 += SquaredDiff(ot, orf, &e.out_ref2);
    }
  }
  for (const ErrorSums& e : result.layers) result.total.Add(e);
  return result;
}

}  // namespace statecache
