// The format report: the storage table of every state format and a replay of
// one decode trajectory through each format on a backend, with its error
// against FP32 states. `statecachectl formats` and the tests print it.
#ifndef STATECACHE_KERNELS_EVAL_FORMAT_REPORT_H_
#define STATECACHE_KERNELS_EVAL_FORMAT_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/eval/replay.h"
#include "kernels/formats/format.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

// One row of the storage table for a d_k x d_v head.
struct StorageRow {
  FormatSpec spec;
  double payload_bits = 0;   // as the seeds count them
  double storage_bits = 0;   // allocated, padding included
  int64_t head_bytes = 0;
  double saving_vs_fp32 = 0; // 1 - storage / fp32
};

std::vector<StorageRow> StorageTable(int d_k, int d_v, int k_hi);

// Fixed-width text table of StorageTable(), plus bytes per request for the
// given geometry (layers x h_v heads).
std::string FormatStorageTable(const std::vector<StorageRow>& rows, const ModelGeometry& geometry);

struct AccuracyRow {
  FormatSpec spec;
  double payload_bits = 0;
  double state_rrmse = 0;
  double output_rrmse = 0;
};

// Replays `trajectories` under every format (DAMP formats with `key_perm`
// rows first when given, else identity) and returns one row per format.
absl::StatusOr<std::vector<AccuracyRow>> AccuracyTable(
    Backend& backend, const std::vector<Trajectory>& trajectories, int k_hi,
    const std::vector<int32_t>& damp_key_perm, const ReplayOptions& options);

std::string FormatAccuracyTable(const std::vector<AccuracyRow>& rows);

// Key permutation per (layer, head) putting the k_hi rows of largest
// int8-hadamard error energy first (stable partition), measured on FP32
// replays of `trajectories` every 8 tokens: the "E only" selector of
// DESIGN.md section 4, used when no calibrated layout is at hand.
absl::StatusOr<std::vector<int32_t>> ErrorEnergyKeyPerm(Backend& backend,
                                                        const std::vector<Trajectory>& trajectories,
                                                        int k_hi);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_EVAL_FORMAT_REPORT_H_
