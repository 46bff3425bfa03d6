// Calibrate: the calibration library (kernels/calibration) over the messages
// of one Calibrate stream, as `statecachectl calibrate` runs it: trajectory
// files in, a layout file (and optionally a registered model) out.
// Transport-free; the gRPC service reads the stream and calls this.
//
//   ops::CalibrateInput in{msgs, limits.max_calibration_bytes, register_model};
//   RETURN_IF_ERROR(ops::Calibrate(in, &resp));
#ifndef STATECACHE_SERVER_OPS_CALIBRATE_H_
#define STATECACHE_SERVER_OPS_CALIBRATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "proto/statecache/v1/statecache.pb.h"

namespace statecache {
namespace ops {

struct CalibrateInput {
  // The stream's messages: the first carries the settings, any carries a
  // trajectory file (safetensors bytes) with an optional domain.
  const std::vector<v1::CalibrateRequest>* messages = nullptr;
  // Trajectory bytes accepted, all messages together.
  int64_t max_calibration_bytes = int64_t{1} << 30;
  // Registers the calibrated layout when settings.model_id is set (the
  // caller's RegisterModel: quotas, persistence).
  std::function<absl::Status(const v1::RegisterModelRequest&, v1::RegisterModelResponse*)>
      register_model;
};

// kInvalidArgument naming "settings.<field>" or "message <i>: <field>" for a
// bad stream, kResourceExhausted beyond max_calibration_bytes; the register
// call's status unchanged.
absl::Status Calibrate(const CalibrateInput& in, v1::CalibrateResponse* resp);

// kResourceExhausted naming max_calibration_bytes (`total` bytes so far);
// readers of a stream return it as soon as the bound is passed.
absl::Status ExceedsCalibrationBytes(int64_t total, int64_t limit);

}  // namespace ops
}  // namespace statecache

#endif  // STATECACHE_SERVER_OPS_CALIBRATE_H_
