// BuildInfo: the project version and git revision a binary was built from.
//
// The version is the top-level VERSION file, the revision the checkout's
// `git rev-parse HEAD` at build time ("unknown" outside git). Link this
// library into binaries only (it is regenerated at every commit).
//
//   absl::FlagsUsageConfig config;
//   config.version_string = [] { return VersionString("statecached"); };
#ifndef STATECACHE_TOOLS_BUILD_INFO_BUILD_INFO_H_
#define STATECACHE_TOOLS_BUILD_INFO_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace statecache {

// Project version, e.g. "0.1.0".
const char* BuildVersion();
// Full git revision (40 hex digits), or "unknown".
const char* BuildRevision();
// "optimized" when compiled with NDEBUG (the default), else "debug
// (assertions on)" (--config=debug).
const char* BuildType();
// "<program> <version>\nrevision <revision>\n<type> build\n", what --version
// prints.
std::string VersionString(absl::string_view program);

}  // namespace statecache

#endif  // STATECACHE_TOOLS_BUILD_INFO_BUILD_INFO_H_
