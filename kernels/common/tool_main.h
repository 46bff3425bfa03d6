// main() of a command-line tool whose work is one absl::Status function:
//
//   int main(int argc, char** argv) { return statecache::ToolMain(argc, argv, statecache::Run); }
//
// Parses the absl flags (after setting `usage`, when given), runs `run`, and
// on failure prints "error: <status>" to stderr and returns 1.
#ifndef STATECACHE_KERNELS_COMMON_TOOL_MAIN_H_
#define STATECACHE_KERNELS_COMMON_TOOL_MAIN_H_

#include <cstdio>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"

namespace statecache {

inline int ToolMain(int argc, char** argv, absl::Status (*run)(), const char* usage = nullptr) {
  if (usage != nullptr) absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = run();
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace statecache

#endif  // STATECACHE_KERNELS_COMMON_TOOL_MAIN_H_
