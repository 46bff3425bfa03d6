// The checkpoint blob image (checkpoint_blob.h): a golden image written by
// the disk tier before the codec had its own file still decodes, encoding
// reproduces it byte for byte, and every flipped byte or truncation is
// kDataLoss.
#include "server/pool/checkpoint_blob.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace statecache {
namespace {

constexpr char kGoldenTags[] = "model=golden;format=int8;fp=0123";

// SCCKPT02 image of GoldenBlob() under kGoldenTags (167 bytes), as DiskTier
// wrote it before the codec moved out of disk_tier.cc.
constexpr char kGoldenHex[] =
    "5343434b50543032200000006d6f64656c3d676f6c64656e3b666f726d61743d"
    "696e74383b66703d30313233efcdab89674523012a0000000000000001200001"
    "02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f1800"
    "0000000000000300000005000000000000000000000000000000040000000000"
    "0000052a4f7499bee3082d52779cc1e60b30557a9fc4e90e33586175782d3000"
    "01feff1d2e789e";

CheckpointBlob GoldenBlob() {
  CheckpointBlob b;
  b.key.hash = 0x0123456789abcdefull;
  b.key.num_tokens = 42;
  b.key.kind = PrefixKeyKind::kSha256;
  for (int i = 0; i < 32; ++i) b.key.digest.push_back(static_cast<char>(i));
  for (int i = 0; i < 24; ++i) b.packed.push_back(static_cast<char>((i * 37 + 5) & 0xff));
  b.aux = {"aux-0", "", std::string("\x00\x01\xfe\xff", 4)};
  return b;
}

TEST(CheckpointBlobTest, GoldenImageDecodesAndReencodesByteForByte) {
  const std::string golden = absl::HexStringToBytes(kGoldenHex);
  ASSERT_EQ(golden.size(), 167u);
  auto blob = DecodeCheckpointBlob(kGoldenTags, golden);
  ASSERT_TRUE(blob.ok()) << blob.status();
  const CheckpointBlob want = GoldenBlob();
  EXPECT_EQ(blob->key, want.key);
  EXPECT_EQ(blob->packed, want.packed);
  EXPECT_EQ(blob->aux, want.aux);
  EXPECT_EQ(absl::BytesToHexString(EncodeCheckpointBlob(kGoldenTags, want)), kGoldenHex);
}

TEST(CheckpointBlobTest, HeaderOfGoldenImage) {
  const std::string golden = absl::HexStringToBytes(kGoldenHex);
  auto header = ParseCheckpointBlobHeader(golden);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->tags, kGoldenTags);
  EXPECT_EQ(header->key, GoldenBlob().key);
  EXPECT_EQ(header->body_bytes(), 24u + 5 + 0 + 4);
  EXPECT_EQ(header->header_bytes + header->body_bytes() + 4, golden.size());
}

TEST(CheckpointBlobTest, DecodeRejectsEveryFlippedByteAndEveryTruncation) {
  const std::string image = EncodeCheckpointBlob(kGoldenTags, GoldenBlob());
  ASSERT_TRUE(DecodeCheckpointBlob(kGoldenTags, image).ok());
  for (size_t i = 0; i < image.size(); ++i) {
    std::string bad = image;
    bad[i] ^= 0x20;
    EXPECT_EQ(DecodeCheckpointBlob(kGoldenTags, bad).status().code(), absl::StatusCode::kDataLoss)
        << "flipped byte " << i;
  }
  for (size_t n = 0; n < image.size(); ++n) {
    EXPECT_EQ(DecodeCheckpointBlob(kGoldenTags, image.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << "truncated to " << n;
  }
  EXPECT_EQ(DecodeCheckpointBlob("other tags", image).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace statecache
