// torch_check_ops: the server-side half of tests/dataplane/torch_attached_check.py
// (the PyTorch attached-mode check on the device), so that the Python check
// needs no grpcio: registers a model, allocates slots, runs unary Update RPCs
// (inline bytes: the server's own path) and exports packed states, through
// the C++ client. One command per process; a failed call prints
//   ERROR <code number> <CODE_NAME>: <message>
// on stdout and exits 3 (bad arguments: 2), so the caller can check the
// code and the field named.
//
//   torch_check_ops --target=unix:/tmp/sc.sock register --model=m \
//       --geometry=gdn:2:2:4:128:128 --format=damp:16 --slots=16
//   torch_check_ops --target=... allocate --model=m --count=3
//       -> one line per slot: "slot <id> <generation>"
//   torch_check_ops --target=... update --model=m --slots=<id>:<gen>,... \
//       --dtype=bf16 --steps=4 --inputs=in.bin --out=o.bin
//       in.bin: for each step, for each layer: q, k, v (dtype), g, beta
//       (fp32), dense row-major, shapes as Update's; o.bin: the fp32 o of
//       every (step, layer) in the same order
//   torch_check_ops --target=... export --model=m --slots=... --out=state
//       -> state.<i>: the packed bytes of slot i; prints "packed <i> <bytes>"
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cpp/statecache_client.h"
#include "kernels/common/status_macros.h"

ABSL_FLAG(std::string, target, "", "statecached address (unix:PATH or host:port).");
ABSL_FLAG(std::string, model, "", "Model id.");
ABSL_FLAG(std::string, geometry, "gdn:2:2:4:128:128", "register: arch:layers:h_qk:h_v:d_k:d_v.");
ABSL_FLAG(std::string, format, "damp:16", "register: storage format.");
ABSL_FLAG(int64_t, slots_capacity, 16, "register: slots of the model's pool.");
ABSL_FLAG(int, count, 1, "allocate: number of slots.");
ABSL_FLAG(std::string, slots, "", "update / export: <id>:<generation>,...");
ABSL_FLAG(std::string, dtype, "bf16", "update: q / k / v dtype (fp32, bf16, fp16).");
ABSL_FLAG(int, steps, 1, "update: decode steps in --inputs.");
ABSL_FLAG(std::string, inputs, "", "update: input file.");
ABSL_FLAG(std::string, out, "", "update: o file; export: prefix of the state files.");

namespace statecache {
namespace {

absl::StatusOr<std::vector<SlotHandle>> ParseSlots(const std::string& text) {
  std::vector<SlotHandle> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> p = absl::StrSplit(item, ':');
    SlotHandle h;
    if (p.size() != 2 || !absl::SimpleAtoi(p[0], &h.id) || !absl::SimpleAtoi(p[1], &h.generation)) {
      return absl::InvalidArgumentError(absl::StrCat("slots: '", item, "' is not <id>:<gen>"));
    }
    out.push_back(h);
  }
  if (out.empty()) return absl::InvalidArgumentError("slots: none given");
  return out;
}

absl::StatusOr<std::unique_ptr<StateCacheClient>> Connect() {
  const std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) return absl::InvalidArgumentError("target: empty");
  ASSIGN_OR_RETURN(auto c, StateCacheClient::Connect(target));
  RETURN_IF_ERROR(c->WaitForReady(absl::Seconds(30)));
  return c;
}

absl::Status Register() {
  ASSIGN_OR_RETURN(auto c, Connect());
  ModelRegistration r;
  r.model_id = absl::GetFlag(FLAGS_model);
  ASSIGN_OR_RETURN(r.geometry, ParseGeometry(absl::GetFlag(FLAGS_geometry), "geometry"));
  r.format = absl::GetFlag(FLAGS_format);
  r.slots = absl::GetFlag(FLAGS_slots_capacity);
  r.checkpoints = 1;
  ASSIGN_OR_RETURN(v1::ModelInfo info, c->RegisterModel(r));
  std::printf("registered %s slot_bytes=%lld\n", r.model_id.c_str(),
              static_cast<long long>(info.slot_bytes()));
  return absl::OkStatus();
}

absl::Status Allocate() {
  ASSIGN_OR_RETURN(auto c, Connect());
  ASSIGN_OR_RETURN(std::vector<SlotHandle> h,
                   c->AllocateSlots(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_count)));
  for (const SlotHandle& s : h) {
    std::printf("slot %llu %u\n", static_cast<unsigned long long>(s.id), s.generation);
  }
  return absl::OkStatus();
}

absl::Status Update() {
  ASSIGN_OR_RETURN(auto c, Connect());
  const std::string model = absl::GetFlag(FLAGS_model);
  ASSIGN_OR_RETURN(ModelGeometry geo, c->Geometry(model));
  ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, ParseSlots(absl::GetFlag(FLAGS_slots)));
  DType dtype;
  const std::string dt = absl::GetFlag(FLAGS_dtype);
  if (dt == "fp32") {
    dtype = DType::kFp32;
  } else if (dt == "bf16") {
    dtype = DType::kBf16;
  } else if (dt == "fp16") {
    dtype = DType::kFp16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("dtype: '", dt, "' is not fp32, bf16, fp16"));
  }
  const int64_t b = static_cast<int64_t>(slots.size());
  const int64_t es = dtype == DType::kFp32 ? 4 : 2;
  const int64_t qk = b * geo.h_qk * geo.d_k * es, vb = b * geo.h_v * geo.d_v * es;
  const int64_t gn = b * geo.h_v * (geo.arch == Arch::kKda ? geo.d_k : 1), bn = b * geo.h_v;
  const int64_t per_layer = 2 * qk + vb + 4 * (gn + bn);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::ifstream f(absl::GetFlag(FLAGS_inputs), std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("inputs: cannot open ", absl::GetFlag(FLAGS_inputs)));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (static_cast<int64_t>(bytes.size()) != per_layer * geo.layers * steps) {
    return absl::InvalidArgumentError(absl::StrCat("inputs: ", bytes.size(), " bytes, want ",
                                                   per_layer * geo.layers * steps));
  }
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("out: cannot create ", absl::GetFlag(FLAGS_out)));
  const char* p = bytes.data();
  for (int s = 0; s < steps; ++s) {
    for (int l = 0; l < geo.layers; ++l) {
      UpdateCall call;
      call.layer = l;
      call.slots = slots;
      call.q = {dtype, absl::string_view(p, qk)};
      call.k = {dtype, absl::string_view(p + qk, qk)};
      call.v = {dtype, absl::string_view(p + 2 * qk, vb)};
      const float* g = reinterpret_cast<const float*>(p + 2 * qk + vb);
      call.g = absl::MakeConstSpan(g, gn);
      call.beta = absl::MakeConstSpan(g + gn, bn);
      ASSIGN_OR_RETURN(std::vector<float> o, c->Update(model, call));
      out.write(reinterpret_cast<const char*>(o.data()), 4 * o.size());
      p += per_layer;
    }
  }
  out.close();
  if (!out) return absl::InternalError("out: write failed");
  std::printf("updated %d steps x %d layers, B=%lld\n", steps, geo.layers,
              static_cast<long long>(b));
  return absl::OkStatus();
}

absl::Status Export() {
  ASSIGN_OR_RETURN(auto c, Connect());
  ASSIGN_OR_RETURN(std::vector<SlotHandle> slots, ParseSlots(absl::GetFlag(FLAGS_slots)));
  for (size_t i = 0; i < slots.size(); ++i) {
    ASSIGN_OR_RETURN(ExportedState st, c->Export(absl::GetFlag(FLAGS_model), slots[i]));
    const std::string path = absl::StrCat(absl::GetFlag(FLAGS_out), ".", i);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(st.packed.data(), st.packed.size());
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("out: cannot write ", path));
    std::printf("packed %zu %zu\n", i, st.packed.size());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: torch_check_ops --target=... register|allocate|update|export ...\n");
    return 2;
  }
  const std::string cmd = args[1];
  absl::Status s;
  if (cmd == "register") {
    s = statecache::Register();
  } else if (cmd == "allocate") {
    s = statecache::Allocate();
  } else if (cmd == "update") {
    s = statecache::Update();
  } else if (cmd == "export") {
    s = statecache::Export();
  } else {
    std::fprintf(stderr, "unknown command '%s'\n", cmd.c_str());
    return 2;
  }
  if (!s.ok()) {
    std::printf("ERROR %d %s: %s\n", static_cast<int>(s.code()),
                absl::StatusCodeToString(s.code()).c_str(), std::string(s.message()).c_str());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
