// SharedMemoryRegion: a mapped POSIX shared-memory object, the CPU-backend
// memory of the data plane (issue 10).
//
// Why named POSIX shm (shm_open) rather than passing a memfd over a side
// channel (SCM_RIGHTS) or a /proc/<pid>/fd path: it needs no second socket
// protocol next to gRPC, works across containers that share /dev/shm (a
// Kubernetes memory emptyDir) without a shared PID namespace, and its
// lifetime is easy to make leak-free: the creator uses O_CREAT | O_EXCL and
// mode 0600 with an unguessable name (128 random bits), and the server
// unlinks a worker's name as soon as it has mapped it, so the object then
// lives exactly as long as the two mappings. Names are restricted to
// "/statecache-" + 8..64 of [A-Za-z0-9_-] so a request can never make the
// server open some other service's object.
//
//   ASSIGN_OR_RETURN(auto mine, SharedMemoryRegion::Create(1 << 20));   // worker
//   ... send mine->name() ...
//   ASSIGN_OR_RETURN(auto theirs, SharedMemoryRegion::Open(name, 1 << 20,
//                                   /*unlink_name=*/true, "shm_name"));  // server
#ifndef STATECACHE_KERNELS_SHM_SHM_REGION_H_
#define STATECACHE_KERNELS_SHM_SHM_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

class SharedMemoryRegion {
 public:
  // Creates a new zero-filled object of `bytes` (>= 1) under a fresh random
  // name and maps it read-write. The name stays linked until Unlink() or
  // destruction. kResourceExhausted when /dev/shm cannot hold it.
  static absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> Create(int64_t bytes);

  // Maps the first `bytes` of the existing object `name`. kInvalidArgument
  // naming `field` for a malformed name or an object smaller than `bytes`;
  // kNotFound when no such object exists. With unlink_name the name is
  // removed once mapped (the mapping stays valid).
  static absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> Open(absl::string_view name,
                                                                  int64_t bytes, bool unlink_name,
                                                                  absl::string_view field);

  // OK for "/statecache-" + 8..64 of [A-Za-z0-9_-].
  static absl::Status ValidateName(absl::string_view name, absl::string_view field);

  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;
  ~SharedMemoryRegion();

  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Removes the name if this region created it (idempotent; Open never
  // owns the name); existing mappings stay valid.
  void Unlink();

 private:
  SharedMemoryRegion(std::string name, uint8_t* data, int64_t size, bool linked)
      : name_(std::move(name)), data_(data), size_(size), linked_(linked) {}
  std::string name_;
  uint8_t* data_;
  int64_t size_;
  bool linked_;
};

}  // namespace statecache

#endif  // STATECACHE_KERNELS_SHM_SHM_REGION_H_
