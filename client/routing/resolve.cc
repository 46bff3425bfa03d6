#include "client/routing/resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace statecache {

absl::StatusOr<std::vector<std::string>> ResolveEndpoints(absl::string_view host, int port) {
  if (host.empty()) return absl::InvalidArgumentError("host: empty");
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: ", port, " not in 1..65535"));
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const std::string name(host);
  const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    const std::string msg = absl::StrCat("host: cannot resolve '", name, "': ", gai_strerror(rc));
    return rc == EAI_AGAIN ? absl::UnavailableError(msg) : absl::NotFoundError(msg);
  }
  std::vector<std::string> endpoints;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      endpoints.push_back(absl::StrCat(buf, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf,
                sizeof(buf));
      endpoints.push_back(absl::StrCat("[", buf, "]:", port));
    }
  }
  freeaddrinfo(result);
  std::sort(endpoints.begin(), endpoints.end());
  endpoints.erase(std::unique(endpoints.begin(), endpoints.end()), endpoints.end());
  if (endpoints.empty()) {
    return absl::NotFoundError(absl::StrCat("host: '", name, "' has no IPv4/IPv6 address"));
  }
  return endpoints;
}

}  // namespace statecache
