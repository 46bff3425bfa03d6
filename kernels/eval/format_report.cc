#include "kernels/eval/format_report.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/status_macros.h"
#include "kernels/formats/hadamard.h"
#include "kernels/formats/head_codec.h"
#include "kernels/formats/head_layout.h"

namespace statecache {

std::vector<StorageRow> StorageTable(int d_k, int d_v, int k_hi) {
  std::vector<StorageRow> rows;
  const double fp32_bytes = 4.0 * d_k * d_v;
  for (StateFormat f : AllStateFormats()) {
    const FormatSpec spec{f, IsMixedFormat(f) ? k_hi : 0};
    const PackedHeadLayout l = MakeHeadLayout(spec, d_k, d_v);
    rows.push_back(StorageRow{spec, l.PayloadBitsPerValue(), l.StorageBitsPerValue(), l.head_bytes,
                              1.0 - l.head_bytes / fp32_bytes});
  }
  return rows;
}

std::string FormatStorageTable(const std::vector<StorageRow>& rows, const ModelGeometry& geo) {
  std::string out = absl::StrFormat("%-16s %10s %10s %11s %9s %14s\n", "format", "bits/value",
                                    "allocated", "bytes/head", "vs fp32",
                                    absl::StrCat("MiB/request"));
  for (const StorageRow& r : rows) {
    const double mib = static_cast<double>(r.head_bytes) * geo.HeadsPerSlot() / (1 << 20);
    absl::StrAppendFormat(&out, "%-16s %10.3f %10.3f %11d %8.1f%% %14.2f\n",
                          FormatSpecName(r.spec), r.payload_bits, r.storage_bits, r.head_bytes,
                          r.saving_vs_fp32 > 0 ? -100.0 * r.saving_vs_fp32 : 0.0, mib);
  }
  absl::StrAppend(&out, "MiB/request for ", geo.DebugString(), "\n");
  return out;
}

absl::StatusOr<std::vector<int32_t>> ErrorEnergyKeyPerm(Backend& backend,
                                                        const std::vector<Trajectory>& trajectories,
                                                        int k_hi) {
  if (trajectories.empty()) return absl::InvalidArgumentError("trajectories: empty");
  const ModelGeometry& geo = trajectories[0].geometry;
  ASSIGN_OR_RETURN(StateLayout fp32, StateLayout::Identity(geo, FormatSpec{StateFormat::kFp32, 0}));
  ASSIGN_OR_RETURN(auto model, backend.Prepare(fp32));
  ASSIGN_OR_RETURN(auto pool_buf, backend.Allocate(fp32.slot_bytes()));
  ASSIGN_OR_RETURN(auto slot_buf, backend.Allocate(4));
  const int32_t zero = 0;
  RETURN_IF_ERROR(backend.CopyIn(slot_buf->data(), &zero, 4));
  const auto* slot = reinterpret_cast<const int32_t*>(slot_buf->data());
  PoolView pool{pool_buf->data(), 1, geo.layers, geo.h_v, fp32.head_layout().head_bytes};
  const int64_t head_values = int64_t{geo.d_k} * geo.d_v;
  std::vector<double> energy(geo.HeadsPerSlot() * geo.d_k, 0.0);
  std::vector<float> state(geo.HeadsPerSlot() * head_values), row(geo.d_v), back(geo.d_v);
  std::vector<uint8_t> codes(geo.d_v), meta(RowMetaBytes(RowCodec::kAffineU8, geo.d_v));
  ASSIGN_OR_RETURN(auto o_buf, backend.Allocate(int64_t{geo.h_v} * geo.d_v * 4));
  for (const Trajectory& traj : trajectories) {
    RETURN_IF_ERROR(backend.ZeroSlots(pool, slot, 1));
    for (int t = 0; t < traj.tokens; ++t) {
      for (int layer = 0; layer < geo.layers; ++layer) {
        const LayerInputs& in = traj.layers[layer];
        // CPU backend only: inputs are read in place (host memory).
        DecodeInputs d{1, slot, DType::kFp32, &in.q[int64_t{t} * geo.h_qk * geo.d_k],
                       &in.k[int64_t{t} * geo.h_qk * geo.d_k], &in.v[int64_t{t} * geo.h_v * geo.d_v],
                       &in.g[int64_t{t} * geo.h_v * geo.GateWidth()], &in.beta[int64_t{t} * geo.h_v],
                       reinterpret_cast<float*>(o_buf->data())};
        RETURN_IF_ERROR(backend.DecodeUpdate(*model, pool, layer, d));
      }
      if ((t + 1) % 8 != 0) continue;
      RETURN_IF_ERROR(backend.UnpackStates(*model, pool, slot, 1, state.data()));
      for (int64_t h = 0; h < geo.HeadsPerSlot(); ++h) {
        for (int u = 0; u < geo.d_k; ++u) {
          const float* s = &state[h * head_values + int64_t{u} * geo.d_v];
          std::copy(s, s + geo.d_v, row.begin());
          BlockHadamard32(row.data(), geo.d_v);
          EncodeRow(RowCodec::kAffineU8, row.data(), geo.d_v,
                    ContiguousRowUnits(RowCodec::kAffineU8, codes.data(), meta.data()), 0.0f);
          DecodeRow(RowCodec::kAffineU8,
                    ContiguousRowUnits<const uint8_t>(RowCodec::kAffineU8, codes.data(), meta.data()),
                    geo.d_v, 0.0f, back.data());
          double e = 0;
          for (int j = 0; j < geo.d_v; ++j) e += (double{back[j]} - row[j]) * (back[j] - row[j]);
          energy[h * geo.d_k + u] += e;
        }
      }
    }
  }
  std::vector<int32_t> perm;
  for (int64_t h = 0; h < geo.HeadsPerSlot(); ++h) {
    std::vector<int32_t> idx(geo.d_k);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
      return energy[h * geo.d_k + a] > energy[h * geo.d_k + b];
    });
    std::vector<bool> hi(geo.d_k, false);
    for (int i = 0; i < k_hi; ++i) hi[idx[i]] = true;
    for (int u = 0; u < geo.d_k; ++u) if (hi[u]) perm.push_back(u);
    for (int u = 0; u < geo.d_k; ++u) if (!hi[u]) perm.push_back(u);
  }
  return perm;
}

absl::StatusOr<std::vector<AccuracyRow>> AccuracyTable(
    Backend& backend, const std::vector<Trajectory>& trajectories, int k_hi,
    const std::vector<int32_t>& damp_key_perm, const ReplayOptions& options) {
  if (trajectories.empty()) return absl::InvalidArgumentError("trajectories: empty");
  const ModelGeometry& geo = trajectories[0].geometry;
  std::vector<AccuracyRow> rows;
  for (StateFormat f : AllStateFormats()) {
    const FormatSpec spec{f, IsMixedFormat(f) ? k_hi : 0};
    absl::StatusOr<StateLayout> layout = StateLayout::Identity(geo, spec);
    if (IsMixedFormat(f) && !damp_key_perm.empty()) {
      std::vector<int32_t> order;
      std::vector<float> scale;
      if (f == StateFormat::kDampSr) {
        order = layout->all_value_orders();
        scale = layout->all_value_scales();
      }
      layout = StateLayout::Create(geo, spec, damp_key_perm, order, scale);
    }
    RETURN_IF_ERROR(layout.status());
    ASSIGN_OR_RETURN(ReplayResult r, ReplayAgainstFp32(backend, *layout, trajectories, options));
    rows.push_back(AccuracyRow{spec, layout->head_layout().PayloadBitsPerValue(),
                               r.total.StateRrmse(), r.total.OutputRrmse()});
  }
  return rows;
}

std::string FormatAccuracyTable(const std::vector<AccuracyRow>& rows) {
  std::string out = absl::StrFormat("%-16s %10s %13s %13s\n", "format", "bits/value",
                                    "state RRMSE", "output RRMSE");
  for (const AccuracyRow& r : rows) {
    absl::StrAppendFormat(&out, "%-16s %10.3f %13.3e %13.3e\n", FormatSpecName(r.spec),
                          r.payload_bits, r.state_rrmse, r.output_rrmse);
  }
  return out;
}

}  // namespace statecache
