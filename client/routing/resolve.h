// ResolveEndpoints: the "ip:port" endpoints a DNS name resolves to, for
// building a HashRing over a Kubernetes headless Service (one A/AAAA record
// per ready statecached pod). Same result format as the Python client's
// ShardedClient.from_dns: "a.b.c.d:port" for IPv4, "[v6]:port" for IPv6,
// sorted and deduplicated, so both languages build identical rings.
//
//   ASSIGN_OR_RETURN(std::vector<std::string> endpoints,
//       ResolveEndpoints("statecached-headless.statecache.svc.cluster.local", 50051));
//   ASSIGN_OR_RETURN(HashRing ring, HashRing::Create(std::move(endpoints)));
#ifndef STATECACHE_CLIENT_ROUTING_RESOLVE_H_
#define STATECACHE_CLIENT_ROUTING_RESOLVE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

// kInvalidArgument for an empty host or a port outside 1..65535;
// kNotFound when the name does not resolve (message has the resolver's
// error); kUnavailable for a temporary resolver failure (retry).
// Blocking (getaddrinfo); thread-safe.
absl::StatusOr<std::vector<std::string>> ResolveEndpoints(absl::string_view host, int port);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_ROUTING_RESOLVE_H_
