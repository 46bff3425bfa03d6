#include "server/pool/checkpoint_blob.h"

#include <zlib.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace statecache {
namespace {

constexpr char kMagic[8] = {'S', 'C', 'C', 'K', 'P', 'T', '0', '2'};  // 02: key kind + digest

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

// Reads little-endian integers from an image, failing past its end.
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

absl::StatusOr<CheckpointBlobHeader> ParseHeader(Reader* r) {
  absl::string_view magic;
  if (!r->Take(sizeof(kMagic), &magic) || magic != absl::string_view(kMagic, sizeof(kMagic))) {
    return absl::DataLossError("bad magic");
  }
  CheckpointBlobHeader h;
  uint64_t tags_len = 0, hash = 0, tokens = 0, kind = 0, digest_len = 0, aux_count = 0;
  absl::string_view tags, digest;
  if (!r->Read(4, &tags_len) || !r->Take(tags_len, &tags))
    return absl::DataLossError("truncated tags");
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
  h.header_bytes = r->pos();
  return h;
}

}  // namespace

std::string EncodeCheckpointBlob(absl::string_view tags, const CheckpointBlob& blob) {
  std::string out(kMagic, sizeof(kMagic));
  AppendLe(&out, tags.size(), 4);
  out.append(tags.data(), tags.size());
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

absl::StatusOr<CheckpointBlobHeader> ParseCheckpointBlobHeader(absl::string_view head) {
  Reader r(head);
  return ParseHeader(&r);
}

absl::StatusOr<CheckpointBlob> DecodeCheckpointBlob(absl::string_view tags,
                                                    absl::string_view image) {
  if (image.size() < sizeof(kMagic) + 4) return absl::DataLossError("file too short");
  const size_t body = image.size() - 4;
  Reader crc_reader(image.substr(body));
  uint64_t stored_crc = 0;
  crc_reader.Read(4, &stored_crc);
  Reader r(image.substr(0, body));
  auto header = ParseHeader(&r);
  if (!header.ok()) return header.status();
  if (header->body_bytes() != body - r.pos()) {
    return absl::DataLossError(absl::StrCat("size: header names ", header->body_bytes(),
                                            " payload bytes, file has ", body - r.pos()));
  }
  if (Crc(image.data(), body) != stored_crc) return absl::DataLossError("crc32 mismatch");
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

}  // namespace statecache
