#include "server/pool/disk_tier.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/status_macros.h"
#include "server/pool/checkpoint_blob.h"

namespace statecache {
namespace {

constexpr absl::string_view kSuffix = ".ckpt";

absl::Status ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0750) != 0 && errno != EEXIST) {
        return absl::UnavailableError(
            absl::StrCat("disk tier: cannot create ", partial, ": ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Create(std::string dir, std::string tags,
                                                           int64_t capacity_bytes, LogFn log) {
  if (dir.empty()) return absl::InvalidArgumentError("disk_checkpoint_dir: empty");
  if (capacity_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk_checkpoint_bytes: ", capacity_bytes, " must be >= 1"));
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::unique_ptr<DiskTier> tier(
      new DiskTier(std::move(dir), std::move(tags), capacity_bytes, std::move(log)));
  RETURN_IF_ERROR(MakeDirs(tier->dir_));
  RETURN_IF_ERROR(tier->Reindex());
  return tier;
}

void DiskTier::Log(absl::string_view event, absl::string_view details) const {
  if (log_) {
    log_(event, details);
  } else {
    std::fprintf(stderr, "%s %s\n", std::string(event).c_str(), std::string(details).c_str());
  }
}

absl::Status DiskTier::Reindex() {
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("disk tier: cannot list ", dir_, ": ", std::strerror(errno)));
  }
  struct Found {
    File file;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(dir_, "/", name);
    if (absl::EndsWith(name, ".tmp")) {  // an interrupted write
      unlink(path.c_str());
      continue;
    }
    if (!absl::EndsWith(name, kSuffix)) continue;
    // The header is small; read up to 64 KiB of the file's beginning.
    std::ifstream in(path, std::ios::binary);
    std::string head(64 << 10, '\0');
    in.read(&head[0], static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    auto header = ParseCheckpointBlobHeader(head);
    struct stat st {};
    const bool stat_ok = stat(path.c_str(), &st) == 0;
    absl::string_view why;
    if (!header.ok()) {
      why = header.status().message();
    } else if (header->tags != tags_) {
      why = "other compatibility tags";
    } else if (!stat_ok || static_cast<uint64_t>(st.st_size) != header->header_bytes + header->body_bytes() + 4) {
      why = "size does not match its header";
    } else if (path != PathOf(header->key)) {
      why = "name does not match its key";
    }
    if (!why.empty()) {
      Log("disk_checkpoint_dropped", absl::StrCat("file=", path, " reason=", why));
      unlink(path.c_str());
      ++dropped_corrupt_;
      continue;
    }
    File f{header->key, static_cast<int64_t>(header->body_bytes())};
    found.push_back(Found{f, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                                 st.st_mtim.tv_nsec});
  }
  // Newest first = front of the LRU list.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime_ns > b.mtime_ns; });
  for (const Found& f : found) {
    lru_.push_back(f.file);
    index_[f.file.key] = std::prev(lru_.end());
    bytes_ += f.file.bytes;
  }
  while (bytes_ > capacity_bytes_) {
    Remove(std::prev(lru_.end()));
    ++evictions_;
  }
  return absl::OkStatus();
}

std::string DiskTier::PathOf(const PrefixKey& key) const {
  // Every field of the key, so that keys differing only in kind or digest
  // (other tenants' salts, SHA-256 and engine keys) never share a file.
  return absl::StrFormat("%s/%016x-%d-%d-%s%s", dir_, key.hash, key.num_tokens,
                         static_cast<int>(key.kind), absl::BytesToHexString(key.digest),
                         kSuffix);
}

void DiskTier::Remove(std::list<File>::iterator it) {
  unlink(PathOf(it->key).c_str());
  bytes_ -= it->bytes;
  index_.erase(it->key);
  lru_.erase(it);
}

absl::Status DiskTier::Put(CheckpointBlob blob, std::vector<CheckpointBlob>* evicted) {
  (void)evicted;  // the last tier: what it evicts is dropped
  const int64_t need = blob.bytes();
  if (need > capacity_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("disk tier: checkpoint of ", need,
                                                   " bytes exceeds the budget of ",
                                                   capacity_bytes_, " bytes"));
  }
  auto old = index_.find(blob.key);
  if (old != index_.end()) Remove(old->second);
  while (bytes_ + need > capacity_bytes_) {
    Remove(std::prev(lru_.end()));
    ++evictions_;
  }
  const std::string path = PathOf(blob.key);
  const std::string tmp = path + ".tmp";
  const std::string image = EncodeCheckpointBlob(tags_, blob);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(image.data(), static_cast<std::streamsize>(image.size()));
    out.close();
    if (!out) {
      unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("disk tier: cannot write ", tmp));
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("disk tier: cannot rename ", tmp, ": ", std::strerror(errno)));
  }
  lru_.push_front(File{blob.key, need});
  index_[blob.key] = lru_.begin();
  bytes_ += need;
  return absl::OkStatus();
}

bool DiskTier::LongestHeld(absl::Span<const PrefixKey> candidates, PrefixKey* best) const {
  return LongestHeldIn(index_, candidates, best);
}

absl::StatusOr<CheckpointBlob> DiskTier::Take(const PrefixKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("disk tier: no checkpoint ", key.DebugString()));
  }
  const std::string path = PathOf(key);
  std::string image;
  absl::Status read = ReadFile(path, &image);
  absl::StatusOr<CheckpointBlob> blob =
      read.ok() ? DecodeCheckpointBlob(tags_, image) : absl::StatusOr<CheckpointBlob>(read);
  if (blob.ok() && blob->key != key) blob = absl::DataLossError("key differs from its name");
  Remove(it->second);  // promoted, or corrupt: either way the file goes
  if (!blob.ok()) {
    ++dropped_corrupt_;
    Log("disk_checkpoint_dropped",
        absl::StrCat("file=", path, " reason=", blob.status().message()));
    return absl::DataLossError(
        absl::StrCat("disk tier: checkpoint ", key.DebugString(), " is unreadable (",
                     blob.status().message(), "); deleted"));
  }
  return blob;
}

TierUse DiskTier::use() const {
  TierUse u;
  u.entries = static_cast<int64_t>(lru_.size());
  u.bytes = bytes_;
  u.capacity_bytes = capacity_bytes_;
  u.evictions = evictions_;
  u.dropped_corrupt = dropped_corrupt_;
  return u;
}

std::vector<PrefixKey> DiskTier::KeysByRecency() const {
  std::vector<PrefixKey> keys;
  for (const File& f : lru_) keys.push_back(f.key);
  return keys;
}

}  // namespace statecache
