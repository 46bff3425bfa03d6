#include "server/model_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace statecache {
namespace {

constexpr absl::string_view kSuffix = ".model";

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("data_dir: ", what, " '", path, "': ", std::strerror(errno)));
}

absl::Status WriteDurably(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return Errno("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return Errno("cannot fsync", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("cannot rename", tmp);
  return absl::OkStatus();
}

void SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelStore>> ModelStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("data_dir: empty");
  const std::string models = absl::StrCat(dir, "/models");
  for (const std::string& d : {dir, models}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) return Errno("cannot create", d);
  }
  return std::unique_ptr<ModelStore>(new ModelStore(models));
}

std::string ModelStore::PathOf(absl::string_view tenant, absl::string_view model_id) const {
  // Tenant names and model ids are [A-Za-z0-9._-]; hex keeps "" and "."
  // distinct and unambiguous.
  return absl::StrCat(dir_, "/", tenant.empty() ? "_" : absl::BytesToHexString(tenant), ".",
                      model_id, kSuffix);
}

absl::Status ModelStore::Save(absl::string_view tenant, const v1::RegisterModelRequest& request) {
  std::string bytes;
  if (!request.SerializeToString(&bytes)) {
    return absl::InternalError("data_dir: cannot serialize the registration");
  }
  const std::string path = PathOf(tenant, request.model_id());
  absl::Status s = WriteDurably(path, bytes);
  if (s.ok()) SyncDir(dir_);
  return s;
}

absl::Status ModelStore::Remove(absl::string_view tenant, absl::string_view model_id) {
  const std::string path = PathOf(tenant, model_id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove", path);
  SyncDir(dir_);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModelStore::Entry>> ModelStore::LoadAll() const {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return Errno("cannot list", dir_);
  while (dirent* e = ::readdir(d)) {
    if (absl::EndsWith(e->d_name, kSuffix)) names.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<Entry> out;
  for (const std::string& name : names) {
    Entry entry;
    entry.path = absl::StrCat(dir_, "/", name);
    const size_t dot = name.find('.');
    const std::string tenant_hex = name.substr(0, dot);
    if (tenant_hex != "_") {
      if (tenant_hex.size() % 2 != 0 ||
          tenant_hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return absl::DataLossError(absl::StrCat("data_dir: bad file name '", entry.path, "'"));
      }
      entry.tenant = absl::HexStringToBytes(tenant_hex);
    }
    std::ifstream in(entry.path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in || !entry.request.ParseFromString(ss.str()) ||
        absl::StrCat(entry.request.model_id(), kSuffix) != name.substr(dot + 1)) {
      return absl::DataLossError(
          absl::StrCat("data_dir: '", entry.path, "' is not a model registration"));
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace statecache
