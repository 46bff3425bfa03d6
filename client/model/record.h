// Trajectory recording: the recurrent inputs the model produces for a
// document, in the calibration issue's Trajectory type
// (kernels/trajectory/trajectory.h), ready for WriteTrajectoryFile.
//
//   Fp32StateStore store(model->config().Geometry(), model->pool());
//   ASSIGN_OR_RETURN(Trajectory t, RecordTrajectory(*model, &store, doc, "gdn-tiny"));
//
// The document runs from the zero state as one prefill chunk; with an FP32
// store this is exactly the FP32 trajectory. With a packed store the
// recorded inputs are those of the model running on that format (decode
// regime: each token requantized) when `mode` is kDecode.
#ifndef STATECACHE_CLIENT_MODEL_RECORD_H_
#define STATECACHE_CLIENT_MODEL_RECORD_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/model/corpus.h"
#include "client/model/model.h"
#include "client/model/recurrent_state_store.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

// Every byte of `doc` is an input (all of them produce a state write).
// kInvalidArgument for an empty document.
absl::StatusOr<Trajectory> RecordTrajectory(const LanguageModel& model, RecurrentStateStore* store,
                                            const Document& doc, absl::string_view source,
                                            RecurrentMode mode = RecurrentMode::kPrefill);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_RECORD_H_
