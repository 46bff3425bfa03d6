#include "server/pool/disk_tier.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

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

namespace statecache {
namespace {

constexpr char kMagic[8] = {'S', 'C', 'C', 'K', 'P', 'T', '0', '2'};  // 02: key kind + digest
constexpr absl::string_view kSuffix = ".ckpt";

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t Crc(const char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths; feed large buffers in pieces.
  while (n > 0) {
    const uInt piece = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), piece);
    data += piece;
    n -= piece;
  }
  return static_cast<uint32_t>(crc);
}

// Reads little-endian integers from a file image, failing past its end.
class Reader {
 public:
  explicit Reader(absl::string_view s) : s_(s) {}
  bool Read(int bytes, uint64_t* v) {
    if (pos_ + bytes > s_.size()) return false;
    *v = 0;
    for (int i = 0; i < bytes; ++i) {
      *v |= static_cast<uint64_t>(static_cast<uint8_t>(s_[pos_ + i])) << (8 * i);
    }
    pos_ += bytes;
    return true;
  }
  bool Take(uint64_t n, absl::string_view* out) {
    if (n > s_.size() - pos_) return false;
    *out = s_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  absl::string_view s_;
  size_t pos_ = 0;
};

struct Header {
  std::string tags;
  PrefixKey key;
  uint64_t packed_len = 0;
  std::vector<uint64_t> aux_len;
  uint64_t body_bytes() const {
    uint64_t n = packed_len;
    for (uint64_t a : aux_len) n += a;
    return n;
  }
};

// Parses the header (the re-index pass reads only the file's beginning).
// kDataLoss naming the field.
absl::StatusOr<Header> ParseHeader(Reader* r) {
  absl::string_view magic;
  if (!r->Take(sizeof(kMagic), &magic) || magic != absl::string_view(kMagic, sizeof(kMagic))) {
    return absl::DataLossError("bad magic");
  }
  Header h;
  uint64_t tags_len = 0, hash = 0, tokens = 0, kind = 0, digest_len = 0, aux_count = 0;
  absl::string_view tags, digest;
  if (!r->Read(4, &tags_len) || !r->Take(tags_len, &tags)) return absl::DataLossError("truncated tags");
  h.tags = std::string(tags);
  if (!r->Read(8, &hash) || !r->Read(8, &tokens) || !r->Read(1, &kind) ||
      !r->Read(1, &digest_len) || !r->Take(digest_len, &digest) || !r->Read(8, &h.packed_len) ||
      !r->Read(4, &aux_count)) {
    return absl::DataLossError("truncated header");
  }
  if (kind > static_cast<uint64_t>(PrefixKeyKind::kEngine)) {
    return absl::DataLossError("key kind out of range");
  }
  if (aux_count > 4096) return absl::DataLossError("aux_count out of range");
  h.key = PrefixKey{hash, static_cast<int64_t>(tokens), static_cast<PrefixKeyKind>(kind),
                    std::string(digest)};
  h.aux_len.resize(aux_count);
  for (uint64_t& a : h.aux_len) {
    if (!r->Read(8, &a)) return absl::DataLossError("truncated aux lengths");
  }
  return h;
}

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

std::string DiskTier::Encode(const std::string& tags, const CheckpointBlob& blob) {
  std::string out(kMagic, sizeof(kMagic));
  AppendLe(&out, tags.size(), 4);
  out += tags;
  AppendLe(&out, blob.key.hash, 8);
  AppendLe(&out, static_cast<uint64_t>(blob.key.num_tokens), 8);
  AppendLe(&out, static_cast<uint64_t>(blob.key.kind), 1);
  AppendLe(&out, blob.key.digest.size(), 1);
  out += blob.key.digest;
  AppendLe(&out, blob.packed.size(), 8);
  AppendLe(&out, blob.aux.size(), 4);
  for (const std::string& a : blob.aux) AppendLe(&out, a.size(), 8);
  out += blob.packed;
  for (const std::string& a : blob.aux) out += a;
  AppendLe(&out, Crc(out.data(), out.size()), 4);
  return out;
}

absl::StatusOr<CheckpointBlob> DiskTier::Decode(const std::string& tags, const std::string& file) {
  if (file.size() < sizeof(kMagic) + 4) return absl::DataLossError("file too short");
  const size_t body = file.size() - 4;
  Reader crc_reader(absl::string_view(file).substr(body));
  uint64_t stored_crc = 0;
  crc_reader.Read(4, &stored_crc);
  Reader r(absl::string_view(file).substr(0, body));
  auto header = ParseHeader(&r);
  if (!header.ok()) return header.status();
  if (header->body_bytes() != body - r.pos()) {
    return absl::DataLossError(absl::StrCat("size: header names ", header->body_bytes(),
                                            " payload bytes, file has ", body - r.pos()));
  }
  if (Crc(file.data(), body) != stored_crc) return absl::DataLossError("crc32 mismatch");
  if (header->tags != tags) {
    return absl::DataLossError(absl::StrCat("tags '", header->tags, "' differ from '", tags, "'"));
  }
  CheckpointBlob blob;
  blob.key = header->key;
  absl::string_view part;
  r.Take(header->packed_len, &part);
  blob.packed = std::string(part);
  for (uint64_t len : header->aux_len) {
    r.Take(len, &part);
    blob.aux.emplace_back(part);
  }
  return blob;
}

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
    Reader r(head);
    auto header = ParseHeader(&r);
    struct stat st {};
    const bool stat_ok = stat(path.c_str(), &st) == 0;
    absl::string_view why;
    if (!header.ok()) {
      why = header.status().message();
    } else if (header->tags != tags_) {
      why = "other compatibility tags";
    } else if (!stat_ok || static_cast<uint64_t>(st.st_size) != r.pos() + header->body_bytes() + 4) {
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
  const std::string image = Encode(tags_, blob);
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
      read.ok() ? Decode(tags_, image) : absl::StatusOr<CheckpointBlob>(read);
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
