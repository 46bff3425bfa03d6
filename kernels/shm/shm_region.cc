#include "kernels/shm/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace statecache {
namespace {

constexpr absl::string_view kPrefix = "/statecache-";

std::string Errno() { return std::strerror(errno); }

}  // namespace

absl::Status SharedMemoryRegion::ValidateName(absl::string_view name, absl::string_view field) {
  const bool prefix_ok = name.substr(0, kPrefix.size()) == kPrefix;
  const absl::string_view rest = prefix_ok ? name.substr(kPrefix.size()) : absl::string_view();
  bool chars_ok = rest.size() >= 8 && rest.size() <= 64;
  for (char c : rest) {
    chars_ok &= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-';
  }
  if (!prefix_ok || !chars_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", name.substr(0, 80), "' is not \"/statecache-\" + 8..64 of [A-Za-z0-9_-]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> SharedMemoryRegion::Create(int64_t bytes) {
  if (bytes < 1) return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes, " < 1"));
  absl::BitGen gen;
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = absl::StrFormat("%s%016x%016x", kPrefix, absl::Uniform<uint64_t>(gen),
                           absl::Uniform<uint64_t>(gen));
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return absl::InternalError(absl::StrCat("shm_open ", name, ": ", Errno()));
  if (ftruncate(fd, bytes) != 0) {
    const std::string err = Errno();
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat("ftruncate ", name, " to ", bytes, ": ", err));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    const std::string err = Errno();
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat("mmap ", name, ": ", err));
  }
  return std::unique_ptr<SharedMemoryRegion>(
      new SharedMemoryRegion(std::move(name), static_cast<uint8_t*>(p), bytes, true));
}

absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> SharedMemoryRegion::Open(
    absl::string_view name, int64_t bytes, bool unlink_name, absl::string_view field) {
  if (absl::Status s = ValidateName(name, field); !s.ok()) return s;
  if (bytes < 1) return absl::InvalidArgumentError(absl::StrCat("size_bytes: ", bytes, " < 1"));
  const std::string n(name);
  const int fd = shm_open(n.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(field, ": no shared-memory object '", n, "'"));
    }
    return absl::PermissionDeniedError(absl::StrCat(field, ": cannot open '", n, "': ", Errno()));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < bytes) {
    const int64_t have = st.st_size;
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("size_bytes: ", bytes, " exceeds the ", have,
                                                   " bytes of ", field, " '", n, "'"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("mmap ", n, ": ", Errno()));
  }
  auto region = std::unique_ptr<SharedMemoryRegion>(
      new SharedMemoryRegion(n, static_cast<uint8_t*>(p), bytes, /*linked=*/false));
  if (unlink_name) shm_unlink(n.c_str());
  return region;
}

void SharedMemoryRegion::Unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

SharedMemoryRegion::~SharedMemoryRegion() {
  if (data_ != nullptr) munmap(data_, size_);
  Unlink();
}

}  // namespace statecache
