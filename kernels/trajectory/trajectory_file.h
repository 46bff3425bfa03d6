// Trajectory files: one recorded token sequence (a "document") per file, as
// safetensors with string metadata. The format is specified in
// TRAJECTORY_FORMAT.md next to this header (and a Python writer example).
//
//   __metadata__: format = "statecache.trajectory", version = "1",
//                 arch ("gdn" | "kda"), layers, h_qk, h_v, d_k, d_v,
//                 scale (float text, "0" = 1/sqrt(d_k)), tokens, domain, source
//   layer{i}.q, layer{i}.k   [tokens, h_qk, d_k]
//   layer{i}.v               [tokens, h_v, d_v]
//   layer{i}.g               [tokens, h_v] (gdn) or [tokens, h_v, d_k] (kda)
//   layer{i}.beta            [tokens, h_v]
// Tensors may be F32, F16 or BF16 (converted to FP32 on read).
//
// Reading validates everything: a missing or malformed metadata field, a
// missing, extra or wrongly shaped tensor, an integer dtype, a non-finite
// value, g > 0 or beta outside [0, 1] are kInvalidArgument naming the field
// (prefixed with the path); a missing file is kNotFound.
//
//   RETURN_IF_ERROR(WriteTrajectoryFile(traj, "/tmp/doc0.safetensors"));
//   ASSIGN_OR_RETURN(Trajectory t, ReadTrajectoryFile("/tmp/doc0.safetensors"));
#ifndef STATECACHE_KERNELS_TRAJECTORY_TRAJECTORY_FILE_H_
#define STATECACHE_KERNELS_TRAJECTORY_TRAJECTORY_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/io/safetensors.h"
#include "kernels/trajectory/trajectory.h"

namespace statecache {

inline constexpr char kTrajectoryFormatName[] = "statecache.trajectory";
inline constexpr int kTrajectoryFormatVersion = 1;

// The complete safetensors image of `traj` (F32 tensors). kInvalidArgument
// when traj.Validate() fails.
absl::StatusOr<std::string> SerializeTrajectory(const Trajectory& traj);

// Writes SerializeTrajectory(traj) atomically (temporary file + rename).
absl::Status WriteTrajectoryFile(const Trajectory& traj, const std::string& path);

// Parses and validates an opened safetensors file as a trajectory.
absl::StatusOr<Trajectory> TrajectoryFromSafetensors(const SafetensorsFile& file);

// Opens and parses `path`; errors are prefixed with the path.
absl::StatusOr<Trajectory> ReadTrajectoryFile(const std::string& path);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_TRAJECTORY_TRAJECTORY_FILE_H_
