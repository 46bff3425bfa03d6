// worker: the reference model worker CLI.
//
//   worker eval     --model=gdn-tiny [--corpus=corpus/heldout.jsonl]
//                   [--format=fp32] [--backend=none|cpu|cuda|auto]
//                   [--regime=decode|prefill-decode] [--prefill_tokens=256]
//                   [--server=ADDR]
//   worker generate --model=kda-tiny --prompt="def main(" [--max_new=200]
//                   [--format=damp:16 --backend=cpu] [--server=ADDR]
//   worker sweep    --model=gdn-tiny [--formats=all|int8,damp:16] [--backend=cpu]
//   worker record   --model=gdn-tiny [--corpus=corpus/calibration.jsonl] --out=traj.safetensors
//
// --model is a folder (with config.json and model.safetensors) or a name under
// ../shared/models; --corpus is a file or a path under ../shared (see
// kernels/io/test_data.h for how ../shared is found). --format=fp32 with
// --backend=none (the default) uses the in-process Fp32StateStore; any other
// combination keeps the states in a Backend slot in that format
// (BackendStateStore, identity layout unless --layout is given later by the
// calibration issue). eval and generate with --server=ADDR (e.g.
// 127.0.0.1:50051 or unix:/path) keep the states on that live statecached
// instead: the model is registered there in --format (with the --layouts
// layout; as <model>-2, -3, ... when the id is taken) and driven through a
// RemoteStateStore; --backend is then ignored. With a CPU-backend server the
// results are bit-identical to --backend=cpu in process.
//
// eval prints bits/byte (convention in client/model/eval.h), per domain, the
// predicted byte count and wall time.
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/model/backend_state_store.h"
#include "client/model/corpus.h"
#include "client/cpp/statecache_client.h"
#include "client/model/eval.h"
#include "client/model/format_sweep.h"
#include "client/model/fp32_state_store.h"
#include "client/model/layout_providers.h"
#include "client/model/model.h"
#include "client/model/record.h"
#include "kernels/backend/backend.h"
#include "kernels/common/status_macros.h"
#include "client/remote_store/demo_support.h"
#include "client/remote_store/remote_state_store.h"
#include "kernels/create_backend/create_backend.h"
#include "kernels/formats/format.h"
#include "kernels/io/test_data.h"
#include "kernels/layout/state_layout.h"
#include "kernels/trajectory/trajectory_file.h"

ABSL_FLAG(std::string, model, "gdn-tiny", "model folder, or a name under ../shared/models");
ABSL_FLAG(std::string, corpus, "", "JSON-lines corpus (file, or path under ../shared)");
ABSL_FLAG(std::string, format, "fp32", "state format, e.g. fp32, int8, damp:16");
ABSL_FLAG(std::string, backend, "none", "none (in-process FP32), cpu, cuda or auto");
ABSL_FLAG(std::string, server, "",
          "eval/generate: statecached address (host:port or unix:/path); empty = in process");
ABSL_FLAG(std::string, regime, "decode", "eval regime: decode or prefill-decode");
ABSL_FLAG(int, prefill_tokens, 256, "prefill-decode: bytes prefilled in FP32 then stored once");
ABSL_FLAG(int, threads, 0, "matmul threads (0 = all cores)");
ABSL_FLAG(int, max_docs, 0, "eval/record: only the first N documents (0 = all)");
ABSL_FLAG(std::string, prompt, "def ", "generate: prompt text (bytes)");
ABSL_FLAG(int, max_new, 200, "generate: bytes to generate (greedy)");
ABSL_FLAG(std::string, out, "", "record: output folder (one trajectory file per document)");
ABSL_FLAG(std::string, layouts, "calibrate",
          "layouts of damp/damp-sr/stepquant-*: calibrate (record FP32 trajectories of "
          "--calibration_corpus and calibrate in memory: kernels/calibration for damp/damp-sr, "
          "kernels/stepquant for stepquant-*), identity, or comma-separated layout files");
ABSL_FLAG(std::string, calibration_corpus, "calibration.jsonl",
          "corpus for --layouts=calibrate (file, or path under ../shared/corpus)");
ABSL_FLAG(std::string, formats, "all",
          "sweep: comma-separated format specs, or all (every format, damp/damp-sr at k_hi 16)");

namespace statecache {
namespace {

absl::StatusOr<std::string> ResolveShared(const std::string& path, const std::string& prefix) {
  if (path.find('/') != std::string::npos && path.find("../") != 0) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f != nullptr) {
      std::fclose(f);
      return path;
    }
  }
  return SharedDataPath(prefix + path);
}

// Owns whatever a store needs (backend, store).
struct StoreHolder {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<StateCacheClient> client;  // --server
  std::unique_ptr<RecurrentStateStore> store;
};

absl::StatusOr<std::vector<Document>> LoadCorpusFlag(const std::string& value);

// The --layouts provider. Calibration (or reading the files) runs only when a
// format with a calibrated layout (HasCalibratedLayout) needs it.
absl::StatusOr<LayoutProvider> MakeLayouts(const LanguageModel& model, bool needed) {
  const std::string v = absl::GetFlag(FLAGS_layouts);
  if (v == "identity" || !needed) return IdentityLayouts();
  if (v == "calibrate") {
    ASSIGN_OR_RETURN(std::vector<Document> docs,
                     LoadCorpusFlag(absl::GetFlag(FLAGS_calibration_corpus)));
    CalibrationOptions opts;
    opts.threads = absl::GetFlag(FLAGS_threads);
    std::string info;
    ASSIGN_OR_RETURN(LayoutProvider p, CalibratedLayouts(model, docs, opts, &info));
    std::fprintf(stderr, "layouts: %s\n", info.c_str());
    return p;
  }
  std::vector<std::string> files = absl::StrSplit(v, ',');
  return LayoutsFromFiles(files, model.config().Geometry());
}

// --server: registers the model in --format on the live statecached and
// returns a RemoteStateStore on one slot of it.
absl::StatusOr<StoreHolder> MakeRemoteStore(const LanguageModel& model,
                                            const std::string& server) {
  StoreHolder h;
  ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(absl::GetFlag(FLAGS_format)));
  ASSIGN_OR_RETURN(LayoutProvider layouts, MakeLayouts(model, HasCalibratedLayout(spec.format)));
  ASSIGN_OR_RETURN(StateLayout layout, layouts(model.config().Geometry(), spec));
  ASSIGN_OR_RETURN(h.client, StateCacheClient::Connect(server));
  absl::Status ready = h.client->WaitForReady(absl::Seconds(10));
  if (!ready.ok()) {
    return absl::UnavailableError(absl::StrCat("--server=", server, ": ", ready.message()));
  }
  const std::string name = std::filesystem::path(absl::GetFlag(FLAGS_model)).filename().string();
  Registration reg;
  reg.slots = 1;
  ASSIGN_OR_RETURN(v1::ModelInfo info, RegisterLayout(h.client.get(), name, layout, reg));
  RemoteStateStore::Options o;
  o.layout = layout;
  ASSIGN_OR_RETURN(auto store, RemoteStateStore::Create(h.client.get(), info.model_id(), o));
  h.store = std::move(store);
  return h;
}

absl::StatusOr<StoreHolder> MakeStore(const LanguageModel& model) {
  StoreHolder h;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (backend == "none") {
    if (format != "fp32") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--format=", format, " needs a backend (--backend=cpu|cuda|auto); "
          "--backend=none is the in-process FP32 store"));
    }
    h.store = std::make_unique<Fp32StateStore>(model.config().Geometry(), model.pool());
    return h;
  }
  ASSIGN_OR_RETURN(h.backend, CreateBackend(backend));
  ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(format));
  ASSIGN_OR_RETURN(LayoutProvider layouts, MakeLayouts(model, HasCalibratedLayout(spec.format)));
  ASSIGN_OR_RETURN(StateLayout layout, layouts(model.config().Geometry(), spec));
  ASSIGN_OR_RETURN(auto store, BackendStateStore::Create(h.backend.get(), layout));
  h.store = std::move(store);
  return h;
}

// eval / generate: remote with --server, else in process.
absl::StatusOr<StoreHolder> MakeEvalOrGenerateStore(const LanguageModel& model) {
  const std::string server = absl::GetFlag(FLAGS_server);
  if (!server.empty()) return MakeRemoteStore(model, server);
  return MakeStore(model);
}

absl::StatusOr<std::unique_ptr<LanguageModel>> LoadModel() {
  ASSIGN_OR_RETURN(std::string dir, ResolveShared(absl::GetFlag(FLAGS_model), "models/"));
  LanguageModel::Options opts;
  opts.threads = absl::GetFlag(FLAGS_threads);
  return LanguageModel::Load(dir, opts);
}

absl::StatusOr<std::vector<Document>> LoadCorpusFlag(const std::string& value) {
  ASSIGN_OR_RETURN(std::string path, ResolveShared(value, "corpus/"));
  return ReadCorpus(path);
}

absl::StatusOr<std::vector<Document>> LoadCorpus(const std::string& dflt) {
  std::string c = absl::GetFlag(FLAGS_corpus);
  if (c.empty()) c = dflt;
  ASSIGN_OR_RETURN(std::vector<Document> docs, LoadCorpusFlag(c));
  const int max_docs = absl::GetFlag(FLAGS_max_docs);
  if (max_docs > 0 && static_cast<int>(docs.size()) > max_docs) docs.resize(max_docs);
  return docs;
}

absl::Status Eval() {
  ASSIGN_OR_RETURN(auto model, LoadModel());
  ASSIGN_OR_RETURN(std::vector<Document> docs, LoadCorpus("heldout.jsonl"));
  ASSIGN_OR_RETURN(StoreHolder h, MakeEvalOrGenerateStore(*model));
  EvalOptions opts;
  const std::string regime = absl::GetFlag(FLAGS_regime);
  if (regime == "decode") {
    opts.regime = EvalRegime::kDecode;
  } else if (regime == "prefill-decode") {
    opts.regime = EvalRegime::kPrefillThenDecode;
    opts.prefill_tokens = absl::GetFlag(FLAGS_prefill_tokens);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--regime=", regime, " (expected decode or prefill-decode)"));
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(EvalResult r, Evaluate(*model, h.store.get(), docs, opts));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("model %s, states: %s, regime %s\n", absl::GetFlag(FLAGS_model).c_str(),
              h.store->Describe().c_str(), regime.c_str());
  for (const auto& kv : r.BitsPerByteByDomain()) {
    std::printf("  %-8s %.5f bits/byte\n", kv.first.c_str(), kv.second);
  }
  std::printf("bits/byte %.5f over %lld predicted bytes in %zu documents; %.2f s (%.0f bytes/s)\n",
              r.BitsPerByte(), static_cast<long long>(r.Predicted()), r.docs.size(), secs,
              r.Predicted() / secs);
  // Every digit of the double, for comparing runs bit for bit.
  std::printf("bits/byte exact %.17g\n", r.BitsPerByte());
  return absl::OkStatus();
}

absl::Status Generate() {
  ASSIGN_OR_RETURN(auto model, LoadModel());
  ASSIGN_OR_RETURN(StoreHolder h, MakeEvalOrGenerateStore(*model));
  ModelSession session(model.get(), h.store.get());
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (prompt.empty()) return absl::InvalidArgumentError("--prompt: empty");
  std::vector<int32_t> tokens;
  for (unsigned char c : prompt) tokens.push_back(c);
  std::vector<float> logits;
  const int vocab = model->config().vocab_size;
  // The prompt is one prefill chunk (stored once), then one decode step per byte.
  RETURN_IF_ERROR(session.Forward(tokens, RecurrentMode::kPrefill, &logits));
  std::fprintf(stderr, "states: %s\n", h.store->Describe().c_str());
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  const auto start = std::chrono::steady_clock::now();
  const int max_new = absl::GetFlag(FLAGS_max_new);
  for (int i = 0; i < max_new; ++i) {
    const float* last = &logits[logits.size() - vocab];
    int best = 0;
    for (int j = 1; j < vocab; ++j) {
      if (last[j] > last[best]) best = j;
    }
    std::fputc(best, stdout);
    std::fflush(stdout);
    RETURN_IF_ERROR(session.Forward({best}, RecurrentMode::kDecode, &logits));
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "\n%d bytes in %.2f s (%.1f ms/byte)\n", max_new, secs,
               1000.0 * secs / std::max(1, max_new));
  std::printf("\n");
  return absl::OkStatus();
}

absl::Status Sweep() {
  ASSIGN_OR_RETURN(auto model, LoadModel());
  ASSIGN_OR_RETURN(std::vector<Document> docs, LoadCorpus("heldout.jsonl"));
  std::string backend_name = absl::GetFlag(FLAGS_backend);
  if (backend_name == "none") backend_name = "cpu";
  ASSIGN_OR_RETURN(auto backend, CreateBackend(backend_name));
  std::vector<FormatSpec> specs;
  const std::string formats = absl::GetFlag(FLAGS_formats);
  if (formats == "all") {
    for (StateFormat f : AllStateFormats()) {
      if (f == StateFormat::kFp32) continue;  // the reference row; fp32 in a slot via --formats
      specs.push_back(FormatSpec{f, IsMixedFormat(f) ? kDefaultKHi : 0});
    }
  } else {
    for (absl::string_view name : absl::StrSplit(formats, ',')) {
      ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(name));
      specs.push_back(spec);
    }
  }
  bool calibrated = false;
  for (const FormatSpec& spec : specs) calibrated |= HasCalibratedLayout(spec.format);
  SweepOptions opts;
  opts.prefill_tokens = absl::GetFlag(FLAGS_prefill_tokens);
  ASSIGN_OR_RETURN(opts.layouts, MakeLayouts(*model, calibrated));
  const auto start = std::chrono::steady_clock::now();
  opts.progress = [&](const std::string& row) {
    std::fprintf(stderr, "  done %s (%.0f s)\n", row.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
  ASSIGN_OR_RETURN(auto rows, RunFormatSweep(*model, backend.get(), docs, specs, opts));
  std::printf("model %s, %s, held-out %lld predicted bytes, prefill %d bytes\n\n%s",
              absl::GetFlag(FLAGS_model).c_str(), backend->Describe().c_str(),
              static_cast<long long>(docs.size() * (docs.empty() ? 0 : docs[0].bytes.size() - 1)),
              opts.prefill_tokens, FormatSweepTable(rows).c_str());
  return absl::OkStatus();
}

// One trajectory file per document: <out>/<model>-<index>-<domain>.safetensors
// (kernels/trajectory/trajectory_file.h), recorded with the chosen store
// (FP32 by default: the whole document as one prefill chunk).
absl::Status Record() {
  ASSIGN_OR_RETURN(auto model, LoadModel());
  ASSIGN_OR_RETURN(std::vector<Document> docs, LoadCorpus("calibration.jsonl"));
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("--out: required for record");
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--out: ", out, ": ", ec.message()));
  ASSIGN_OR_RETURN(StoreHolder h, MakeStore(*model));
  const std::string name = std::filesystem::path(absl::GetFlag(FLAGS_model)).filename().string();
  for (size_t i = 0; i < docs.size(); ++i) {
    ASSIGN_OR_RETURN(Trajectory t, RecordTrajectory(*model, h.store.get(), docs[i], name));
    char file[64];
    std::snprintf(file, sizeof(file), "-%03zu-", i);
    const std::string path = absl::StrCat(out, "/", name, file, docs[i].domain, ".safetensors");
    RETURN_IF_ERROR(WriteTrajectoryFile(t, path));
  }
  std::printf("recorded %zu documents (%s) to %s\n", docs.size(), h.store->Describe().c_str(),
              out.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "worker eval|generate|sweep|record [flags]; see client/worker/worker_main.cc");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: worker eval|generate|sweep|record [--flags]\n");
    return 2;
  }
  const std::string cmd = args[1];
  absl::Status st;
  if (cmd == "eval") {
    st = statecache::Eval();
  } else if (cmd == "generate") {
    st = statecache::Generate();
  } else if (cmd == "sweep") {
    st = statecache::Sweep();
  } else if (cmd == "record") {
    st = statecache::Record();
  } else {
    std::fprintf(stderr, "unknown command '%s' (eval, generate or record)\n", cmd.c_str());
    return 2;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
