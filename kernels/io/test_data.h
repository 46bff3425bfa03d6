// SharedDataPath: locates the read-only shared data folder (`shared/`, with
// models/ and corpus/) that sits BESIDE the repository checkout:
//
//   <somewhere>/main/WORKSPACE        <- the repository (any name)
//   <somewhere>/shared/models/...     <- shared data
//
// Used by tests and by tools (the model worker) so neither hard-codes
// /work/shared. Resolution order, first hit wins:
//   1. $STATECACHE_SHARED_DIR/<relative> when that variable is set (and only
//      it: a set but wrong variable is kNotFound, not silently ignored);
//   2. the real path of a runfile this library declares as data
//      (kernels/io/BUILD, found under $TEST_SRCDIR/$TEST_WORKSPACE, under
//      $RUNFILES_DIR, or next to /proc/self/exe as <exe>.runfiles), with
//      symlinks resolved back into the source tree, walked up to the folder
//      holding WORKSPACE, then ../shared/<relative>;
//   3. $BUILD_WORKSPACE_DIRECTORY (set by `bazel run`), then the current
//      directory, each walked up to WORKSPACE, then ../shared/<relative>.
// kNotFound (listing every place tried) when the path exists in none of them.
// Tests that need shared data must ASSERT on the result (fail, not skip).
//
//   ASSIGN_OR_RETURN(std::string p, SharedDataPath("models/gdn-tiny/golden.safetensors"));
#ifndef STATECACHE_KERNELS_IO_TEST_DATA_H_
#define STATECACHE_KERNELS_IO_TEST_DATA_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

// Absolute path of shared/<relative> (a file or folder that exists).
absl::StatusOr<std::string> SharedDataPath(absl::string_view relative);

}  // namespace statecache

#endif  // STATECACHE_KERNELS_IO_TEST_DATA_H_
