// One-line lifecycle logging for statecached.
//
// Debian's Abseil (20220623) has no absl/log, so the server writes its own
// lines to stderr: "2026-11-29T12:00:00.123Z statecached <event> key=value ...".
// Each call writes exactly one line atomically (a mutex serializes writers).
// Thread-safe.
//
//   LogEvent("model_registered", absl::StrCat("model=", id, " slots=", n));
#ifndef STATECACHE_SERVER_CORE_LOG_H_
#define STATECACHE_SERVER_CORE_LOG_H_

#include "absl/strings/string_view.h"

namespace statecache {

// Writes "<time> statecached <event> <details>\n" to stderr unless logging is
// disabled.
void LogEvent(absl::string_view event, absl::string_view details = "");

// Turns logging off (tests) or on. Default on.
void SetLoggingEnabled(bool enabled);

}  // namespace statecache

#endif  // STATECACHE_SERVER_CORE_LOG_H_
