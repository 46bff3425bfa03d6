// Format sweep (issue 4, "Measure"): held-out bits/byte of a model with its
// states in every format, the excess over FP32 states, and greedy next-byte
// agreement with the FP32-state run (teacher forced: same argmax at the same
// position), in two regimes:
//   decode          every byte is a decode step that requantizes the state;
//   prefill-decode  the first `prefill_tokens` bytes prefilled in FP32 and
//                   stored once, then decode.
// The FP32 reference is the in-process Fp32StateStore (same regime).
//
//   ASSIGN_OR_RETURN(auto rows, RunFormatSweep(*model, backend.get(), docs, specs, {}));
//   std::printf("%s", FormatSweepTable(rows).c_str());
#ifndef STATECACHE_CLIENT_MODEL_FORMAT_SWEEP_H_
#define STATECACHE_CLIENT_MODEL_FORMAT_SWEEP_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/model/corpus.h"
#include "client/model/eval.h"
#include "client/model/model.h"
#include "kernels/backend/backend.h"
#include "kernels/formats/format.h"
#include "kernels/layout/state_layout.h"

namespace statecache {

// Supplies the StateLayout of a format: identity maps, or the calibrated
// layout of the calibration issue (DAMP's key permutation, damp-sr maps).
using LayoutProvider =
    std::function<absl::StatusOr<StateLayout>(const ModelGeometry&, const FormatSpec&)>;
// StateLayout::Identity.
LayoutProvider IdentityLayouts();

struct SweepOptions {
  int prefill_tokens = 256;
  LayoutProvider layouts;  // empty = IdentityLayouts()
  // Called after each row (progress); may be empty.
  std::function<void(const std::string&)> progress;
};

struct SweepRegimeResult {
  double bits_per_byte = 0;
  double excess = 0;      // bits_per_byte - FP32 store's bits_per_byte (same regime)
  double agreement = 0;   // greedy agreement with the FP32 store run
  double seconds = 0;
};

struct SweepRow {
  std::string format;        // FormatSpecName, or "fp32 (reference)"
  bool calibrated = false;   // layout not the format's StateLayout::Identity
  // Packed head bytes * 8 / (d_k * d_v); STEPQuant: the slot's exact payload
  // (StateLayout::PayloadBitsPerValue: codes, scales, pivots, no padding).
  double bits_per_value = 0;
  SweepRegimeResult decode, prefill_decode;
};

// Row 0 is the in-process FP32 reference; then one row per spec.
absl::StatusOr<std::vector<SweepRow>> RunFormatSweep(const LanguageModel& model, Backend* backend,
                                                     const std::vector<Document>& docs,
                                                     const std::vector<FormatSpec>& specs,
                                                     const SweepOptions& options);

// Markdown table: formats as rows, metrics as columns.
std::string FormatSweepTable(const std::vector<SweepRow>& rows);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_FORMAT_SWEEP_H_
