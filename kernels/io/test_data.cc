#include "kernels/io/test_data.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace statecache {

namespace {

// This package's BUILD file, declared as `data` of :test_data.
constexpr char kAnchor[] = "kernels/io/BUILD";

bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  if (::realpath(p.c_str(), buf) == nullptr) return "";
  return buf;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string Parent(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return p.substr(0, slash);
}

// Walks up from `start` (a real path) to the folder holding WORKSPACE; "" if none.
std::string FindWorkspaceRoot(std::string dir) {
  while (!dir.empty()) {
    if (Exists(dir + "/WORKSPACE")) return dir;
    if (dir == "/") break;
    dir = Parent(dir);
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> SharedDataPath(absl::string_view relative) {
  const std::string rel(relative);
  const std::string env_dir = Env("STATECACHE_SHARED_DIR");
  if (!env_dir.empty()) {
    const std::string p = env_dir + "/" + rel;
    if (Exists(p)) return p;
    return absl::NotFoundError(
        absl::StrCat("shared data: ", p, " does not exist (STATECACHE_SHARED_DIR=", env_dir, ")"));
  }

  std::vector<std::string> tried;
  auto try_root_of = [&](const std::string& real_start) -> std::string {
    if (real_start.empty()) return "";
    const std::string root = FindWorkspaceRoot(real_start);
    if (root.empty()) {
      tried.push_back(absl::StrCat(real_start, " (no WORKSPACE above)"));
      return "";
    }
    const std::string p = Parent(root) + "/shared/" + rel;
    if (Exists(p)) return RealPath(p);
    tried.push_back(p);
    return "";
  };

  std::vector<std::string> anchors;
  if (!Env("TEST_SRCDIR").empty()) {
    const std::string ws = Env("TEST_WORKSPACE").empty() ? "statecache" : Env("TEST_WORKSPACE");
    anchors.push_back(absl::StrCat(Env("TEST_SRCDIR"), "/", ws, "/", kAnchor));
  }
  if (!Env("RUNFILES_DIR").empty()) {
    anchors.push_back(absl::StrCat(Env("RUNFILES_DIR"), "/statecache/", kAnchor));
  }
  const std::string exe = RealPath("/proc/self/exe");
  if (!exe.empty()) anchors.push_back(absl::StrCat(exe, ".runfiles/statecache/", kAnchor));
  for (const std::string& a : anchors) {
    const std::string real = RealPath(a);
    if (real.empty()) {
      tried.push_back(absl::StrCat(a, " (missing)"));
      continue;
    }
    std::string hit = try_root_of(Parent(real));
    if (!hit.empty()) return hit;
  }
  for (const std::string& dir : {Env("BUILD_WORKSPACE_DIRECTORY"), RealPath(".")}) {
    std::string hit = try_root_of(dir.empty() ? "" : RealPath(dir));
    if (!hit.empty()) return hit;
  }
  return absl::NotFoundError(absl::StrCat(
      "shared data: cannot find shared/", rel,
      " beside the repository; set STATECACHE_SHARED_DIR. Tried: ", absl::StrJoin(tried, "; ")));
}

}  // namespace statecache
