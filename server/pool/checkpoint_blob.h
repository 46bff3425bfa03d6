// The byte image of one CheckpointBlob (checkpoint_tier.h) outside the
// process: a disk-tier file and a Redis value are the same bytes.
//
//   "SCCKPT02"                          8-byte magic
//   u32 tags_len, tags                  the compatibility tags (opaque string)
//   u64 hash, i64 num_tokens            the PrefixKey ...
//   u8 kind, u8 digest_len, digest      ... every field of it
//   u64 packed_len, u32 aux_count, u64 aux_len[aux_count]
//   packed bytes, aux bytes
//   u32 crc32                           zlib CRC-32 of every byte before it
//
// Integers little-endian. Decode checks magic, sizes, CRC and tags and
// returns kDataLoss naming what is wrong; its bytes are never returned then.
//
//   const std::string image = EncodeCheckpointBlob(tags, blob);
//   ASSIGN_OR_RETURN(CheckpointBlob back, DecodeCheckpointBlob(tags, image));
#ifndef STATECACHE_SERVER_POOL_CHECKPOINT_BLOB_H_
#define STATECACHE_SERVER_POOL_CHECKPOINT_BLOB_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/pool/checkpoint_tier.h"

namespace statecache {

// The image of `blob` under `tags`.
std::string EncodeCheckpointBlob(absl::string_view tags, const CheckpointBlob& blob);

// Parses and checks a whole image written under `tags`. kDataLoss naming
// what is wrong (magic, truncation, size, crc32, tags).
absl::StatusOr<CheckpointBlob> DecodeCheckpointBlob(absl::string_view tags,
                                                    absl::string_view image);

// The header alone (the disk tier's re-index reads only a file's beginning).
struct CheckpointBlobHeader {
  std::string tags;
  PrefixKey key;
  uint64_t packed_len = 0;
  std::vector<uint64_t> aux_len;
  size_t header_bytes = 0;  // bytes before the payload

  // Payload bytes (packed + aux): the whole image is header_bytes +
  // body_bytes() + 4 (the CRC).
  uint64_t body_bytes() const {
    uint64_t n = packed_len;
    for (uint64_t a : aux_len) n += a;
    return n;
  }
};

// Parses the header at the beginning of `head` (the payload need not be
// there). kDataLoss naming the field.
absl::StatusOr<CheckpointBlobHeader> ParseCheckpointBlobHeader(absl::string_view head);

}  // namespace statecache

#endif  // STATECACHE_SERVER_POOL_CHECKPOINT_BLOB_H_
