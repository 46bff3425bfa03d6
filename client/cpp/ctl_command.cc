#include "client/cpp/ctl_command.h"

#include "absl/strings/str_format.h"
#include "kernels/common/status_macros.h"

namespace statecache {

absl::StatusOr<StateCacheClient*> CtlContext::client() {
  if (client_ == nullptr) {
    ASSIGN_OR_RETURN(client_, StateCacheClient::Connect(server_, client_options_));
    absl::Status ready = client_->WaitForReady(connect_timeout_);
    if (!ready.ok()) {
      client_.reset();
      return absl::UnavailableError(absl::StrCat("cannot reach statecached at ", server_,
                                                 " (", ready.message(), ")"));
    }
  }
  return client_.get();
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.1f %s", bytes, units[u]);
}

}  // namespace statecache
