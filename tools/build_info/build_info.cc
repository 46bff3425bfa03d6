#include "tools/build_info/build_info.h"

#include "absl/strings/str_cat.h"

namespace statecache {

const char* BuildType() {
#ifdef NDEBUG
  return "optimized";
#else
  return "debug (assertions on)";
#endif
}

std::string VersionString(absl::string_view program) {
  return absl::StrCat(program, " ", BuildVersion(), "\nrevision ", BuildRevision(), "\n",
                      BuildType(), " build\n");
}

}  // namespace statecache
