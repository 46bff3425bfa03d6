#include "client/model/format_sweep.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/model/backend_state_store.h"
#include "client/model/fp32_state_store.h"
#include "kernels/common/status_macros.h"

namespace statecache {

LayoutProvider IdentityLayouts() {
  return [](const ModelGeometry& g, const FormatSpec& s) { return StateLayout::Identity(g, s); };
}

namespace {

constexpr char kReferenceRow[] = "fp32 (reference)";

struct Timed {
  EvalResult result;
  double seconds;
};

absl::StatusOr<Timed> TimedEval(const LanguageModel& model, RecurrentStateStore* store,
                                const std::vector<Document>& docs, const EvalOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(EvalResult r, Evaluate(model, store, docs, opts));
  return Timed{std::move(r), std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                           start).count()};
}

// True when the layout is not the format's identity layout (a key
// permutation, damp-sr value maps, or STEPQuant widths / row impacts other
// than the nominal width and w_i = 1).
absl::StatusOr<bool> IsCalibrated(const StateLayout& layout, const FormatSpec& spec) {
  ASSIGN_OR_RETURN(StateLayout identity, StateLayout::Identity(layout.geometry(), spec));
  return layout.Fingerprint() != identity.Fingerprint();
}

}  // namespace

absl::StatusOr<std::vector<SweepRow>> RunFormatSweep(const LanguageModel& model, Backend* backend,
                                                     const std::vector<Document>& docs,
                                                     const std::vector<FormatSpec>& specs,
                                                     const SweepOptions& options) {
  const ModelGeometry geo = model.config().Geometry();
  const LayoutProvider layouts = options.layouts ? options.layouts : IdentityLayouts();
  EvalOptions dec;
  dec.regime = EvalRegime::kDecode;
  EvalOptions pd;
  pd.regime = EvalRegime::kPrefillThenDecode;
  pd.prefill_tokens = options.prefill_tokens;

  std::vector<SweepRow> rows;
  Fp32StateStore fp32(geo, model.pool());
  ASSIGN_OR_RETURN(Timed ref_dec, TimedEval(model, &fp32, docs, dec));
  ASSIGN_OR_RETURN(Timed ref_pd, TimedEval(model, &fp32, docs, pd));
  SweepRow ref;
  ref.format = kReferenceRow;
  ref.bits_per_value = 32;
  ref.decode = {ref_dec.result.BitsPerByte(), 0.0, 1.0, ref_dec.seconds};
  ref.prefill_decode = {ref_pd.result.BitsPerByte(), 0.0,
                        ref_pd.result.GreedyAgreement(ref_pd.result), ref_pd.seconds};
  rows.push_back(ref);
  if (options.progress) options.progress(ref.format);

  for (const FormatSpec& spec : specs) {
    ASSIGN_OR_RETURN(StateLayout layout, layouts(geo, spec));
    ASSIGN_OR_RETURN(auto store, BackendStateStore::Create(backend, layout));
    ASSIGN_OR_RETURN(Timed d, TimedEval(model, store.get(), docs, dec));
    ASSIGN_OR_RETURN(Timed p, TimedEval(model, store.get(), docs, pd));
    SweepRow row;
    row.format = FormatSpecName(spec);
    ASSIGN_OR_RETURN(row.calibrated, IsCalibrated(layout, spec));
    // STEPQuant heads have calibrated sizes: the exact payload over the slot
    // (head_bytes is their mean stride, padded); the allocated head otherwise.
    row.bits_per_value = IsStepQuantFormat(spec.format)
                             ? layout.PayloadBitsPerValue()
                             : 8.0 * layout.head_layout().head_bytes /
                                   (static_cast<double>(geo.d_k) * geo.d_v);
    row.decode = {d.result.BitsPerByte(), d.result.BitsPerByte() - ref.decode.bits_per_byte,
                  d.result.GreedyAgreement(ref_dec.result), d.seconds};
    row.prefill_decode = {p.result.BitsPerByte(),
                          p.result.BitsPerByte() - ref.prefill_decode.bits_per_byte,
                          p.result.GreedyAgreement(ref_pd.result), p.seconds};
    rows.push_back(row);
    if (options.progress) options.progress(row.format);
  }
  return rows;
}

std::string FormatSweepTable(const std::vector<SweepRow>& rows) {
  std::string out =
      "| format | layout | bits/value | decode bits/byte | decode excess | decode agreement | "
      "prefill+decode bits/byte | prefill+decode excess | prefill+decode agreement |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const SweepRow& r : rows) {
    absl::StrAppend(
        &out,
        absl::StrFormat("| %s | %s | %.3f | %.5f | %+.5f | %.2f%% | %.5f | %+.5f | %.2f%% |\n",
                        r.format, r.format == kReferenceRow ? "-" : (r.calibrated ? "calibrated" : "identity"), r.bits_per_value,
                        r.decode.bits_per_byte, r.decode.excess, 100 * r.decode.agreement,
                        r.prefill_decode.bits_per_byte, r.prefill_decode.excess,
                        100 * r.prefill_decode.agreement));
  }
  return out;
}

}  // namespace statecache
