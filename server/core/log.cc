#include "server/core/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace statecache {
namespace {

std::atomic<bool> g_enabled{true};

absl::Mutex& LogMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

}  // namespace

void SetLoggingEnabled(bool enabled) { g_enabled = enabled; }

void LogEvent(absl::string_view event, absl::string_view details) {
  if (!g_enabled.load()) return;
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                   " statecached ", event, details.empty() ? "" : " ", details, "\n");
  absl::MutexLock lock(&LogMutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace statecache
