// Writes the seed corpus of the fuzz targets into <dir>/<target>/seed_*:
// valid requests of every RPC (with the fix-up bytes of request_fuzz.cc),
// zero / random packed states for Import, small safetensors files and layout
// files. Run once; the output is committed under tests/fuzz/corpus/.
//   bazel run //tests/fuzz:make_seed_corpus -- $PWD/tests/fuzz/corpus
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/io/safetensors.h"
#include "kernels/layout/layout_file.h"
#include "proto/statecache/v1/statecache.pb.h"
#include "server/core/proto_convert.h"

namespace statecache {
namespace {

std::string g_dir;
int g_count = 0;

void Write(const std::string& target, const std::string& bytes) {
  const std::string dir = g_dir + "/" + target;
  mkdir(dir.c_str(), 0755);
  std::ofstream(absl::StrCat(dir, "/seed_", g_count++), std::ios::binary) << bytes;
}

void Request(int op, int flags, const google::protobuf::Message& m) {
  std::string bytes;
  bytes.push_back(static_cast<char>(op));
  bytes.push_back(static_cast<char>(flags));
  bytes += m.SerializeAsString();
  Write("request", bytes);
}

void SetTensor(std::vector<int64_t> shape, float value, v1::Tensor* t) {
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  t->set_dtype(v1::DTYPE_FP32);
  std::vector<float> v(n, value);
  t->set_data(std::string(reinterpret_cast<const char*>(v.data()), n * 4));
}

void Requests() {
  const int kGdn = 1 | 4;  // registered "gdn", live slots
  const int kKda = 1 | 2 | 4;
  for (int b : {1, 2}) {
    v1::UpdateRequest u;
    u.set_layer(1);
    for (int i = 0; i < b; ++i) u.add_slots();
    SetTensor({b, 1, 32}, 0.17f, u.mutable_q());
    SetTensor({b, 1, 32}, 0.17f, u.mutable_k());
    SetTensor({b, 2, 32}, 0.5f, u.mutable_v());
    SetTensor({b, 2}, -0.1f, u.mutable_g());
    SetTensor({b, 2}, 0.5f, u.mutable_beta());
    Request(0, kGdn, u);
    v1::UpdateRequest k;
    k.add_slots();
    SetTensor({1, 2, 32}, 0.17f, k.mutable_q());
    SetTensor({1, 2, 32}, 0.17f, k.mutable_k());
    SetTensor({1, 2, 32}, 0.5f, k.mutable_v());
    SetTensor({1, 2, 32}, -0.1f, k.mutable_g());
    SetTensor({1, 2}, 0.5f, k.mutable_beta());
    Request(0, kKda, k);
  }
  v1::PrefillRequest p;
  p.add_slots();
  v1::PrefillTokens* t = p.mutable_tokens();
  SetTensor({1, 3, 1, 32}, 0.17f, t->mutable_q());
  SetTensor({1, 3, 1, 32}, 0.17f, t->mutable_k());
  SetTensor({1, 3, 2, 32}, 0.25f, t->mutable_v());
  SetTensor({1, 3, 2}, -0.2f, t->mutable_g());
  SetTensor({1, 3, 2}, 0.9f, t->mutable_beta());
  t->set_want_output(true);
  Request(1, kGdn, p);
  v1::PrefillRequest ps;
  ps.add_slots();
  SetTensor({1, 2, 2, 32, 32}, 0.01f, ps.mutable_states());
  Request(1, kGdn, ps);
  v1::SnapshotRequest sn;
  sn.mutable_tokens()->add_ids(5);
  sn.mutable_tokens()->add_ids(6);
  sn.add_aux("conv0");
  sn.add_aux("conv1");
  Request(2, kGdn, sn);
  v1::RestoreRequest r;
  r.mutable_key()->set_hash(123);
  r.mutable_key()->set_num_tokens(2);
  Request(3, kGdn, r);
  v1::LookupPrefixRequest l;
  for (int i : {5, 6, 7}) l.mutable_tokens()->add_ids(i);
  l.set_lease_ms(100);
  Request(4, kGdn, l);
  v1::ExportRequest e;
  Request(5, kKda, e);
  v1::ImportRequest im;
  im.mutable_tags()->set_model_id("gdn");
  im.set_packed(std::string(1024, '\0'));
  Request(6, kGdn, im);
  v1::AllocateSlotsRequest a;
  a.set_count(2);
  Request(7, 1, a);
  v1::ReleaseSlotsRequest rel;
  rel.add_slots()->set_id(42);
  Request(8, 1, rel);
  v1::RegisterModelRequest reg;
  reg.set_model_id("fuzz");
  reg.set_format("damp:8");
  *reg.mutable_geometry() = GeometryToProto({Arch::kGdn, 1, 1, 1, 32, 32});
  reg.set_slots(1);
  reg.set_checkpoints(1);
  Request(9, 0, reg);
  Request(10, 0, v1::GetStatsRequest());
}

void Imports() {
  std::mt19937 rng(7);
  for (int model : {0, 1}) {
    Write("import", std::string{static_cast<char>(model), 1});
    std::string noise = {static_cast<char>(model), 1};
    for (int i = 0; i < 600; ++i) noise.push_back(static_cast<char>(rng() & 0x3f));
    Write("import", noise);
  }
}

void Safetensors() {
  SafetensorsWriter w;
  (void)w.AddFloat32("a", {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  (void)w.AddInt32("b", {3}, std::vector<int32_t>{7, 8, 9});
  w.SetMetadata("format", "pt");
  Write("safetensors", w.Serialize());
  SafetensorsWriter empty;
  Write("safetensors", empty.Serialize());
}

void Layouts() {
  const ModelGeometry g{Arch::kGdn, 1, 1, 2, 32, 32};
  StateLayout identity = StateLayout::Identity(g, ParseFormatSpec("damp:8").value()).value();
  Write("layout_file", SerializeLayout(identity, {{"source", "seed"}}, {}).value());
  std::vector<int32_t> perm;
  std::vector<int32_t> order;
  std::vector<float> scale;
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 32; ++r) perm.push_back((r * 5 + h) % 32);
    for (int j = 0; j < 32; ++j) {
      order.push_back(31 - j);
      scale.push_back(1.0f + j / 32.0f);
    }
  }
  StateLayout sr =
      StateLayout::Create(g, ParseFormatSpec("damp-sr:8").value(), perm, order, scale).value();
  std::vector<float> scores(2 * 32, 0.5f);
  Write("layout_file", SerializeLayout(sr, {}, scores).value());
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seed_corpus <corpus dir>\n");
    return 2;
  }
  statecache::g_dir = argv[1];
  mkdir(argv[1], 0755);
  statecache::Requests();
  statecache::Imports();
  statecache::Safetensors();
  statecache::Layouts();
  std::printf("wrote %d seeds\n", statecache::g_count);
  return 0;
}
