// Records FP32 trajectories of a shipped model (../shared/models/) over a
// corpus (../shared/corpus/) into trajectory files, one per document, so
// `calibrate` / `evaluate` run on real model data:
//
//   record_trajectories --model=/work/shared/models/gdn-tiny \
//       --corpus=/work/shared/corpus/calibration.jsonl --out=/tmp/gdn-cal
//
// Uses client/model's reference forward pass and RecordTrajectory (FP32
// states, the whole document as one prefill chunk from the zero state).
// Files are named <out>/<model>-<index>-<domain>.safetensors.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/ctl_calibration/cli_flags.h"
#include "client/model/corpus.h"
#include "client/model/fp32_state_store.h"
#include "client/model/model.h"
#include "client/model/record.h"
#include "kernels/common/status_macros.h"
#include "kernels/trajectory/trajectory_file.h"

namespace statecache {
namespace {

absl::Status Record(const CliFlags& f) {
  const std::string model_dir = f.Get("model", ""), corpus = f.Get("corpus", ""),
                    out = f.Get("out", "");
  if (model_dir.empty() || corpus.empty() || out.empty()) {
    return absl::InvalidArgumentError("--model, --corpus and --out are required");
  }
  ASSIGN_OR_RETURN(int threads, f.GetInt("threads", 0));
  ASSIGN_OR_RETURN(int max_docs, f.GetInt("max_docs", 0));
  LanguageModel::Options mo;
  mo.threads = threads;
  ASSIGN_OR_RETURN(auto model, LanguageModel::Load(model_dir, mo));
  ASSIGN_OR_RETURN(std::vector<Document> docs, ReadCorpus(corpus));
  if (max_docs > 0 && static_cast<int>(docs.size()) > max_docs) docs.resize(max_docs);
  std::filesystem::create_directories(out);
  const std::string name = std::filesystem::path(model_dir).filename().string();
  Fp32StateStore store(model->config().Geometry(), model->pool());
  for (size_t i = 0; i < docs.size(); ++i) {
    ASSIGN_OR_RETURN(Trajectory t, RecordTrajectory(*model, &store, docs[i], name));
    const std::string path =
        absl::StrFormat("%s/%s-%03d-%s.safetensors", out, name, i, docs[i].domain);
    RETURN_IF_ERROR(WriteTrajectoryFile(t, path));
    std::printf("%s: %d tokens, domain %s\n", path.c_str(), t.tokens, t.domain.c_str());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  auto f = statecache::CliFlags::Parse(argc, argv, {"model", "corpus", "out", "threads", "max_docs"},
                                       {"help"});
  if (!f.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(f.status().message()).c_str());
    return 2;
  }
  if (f->Has("help")) {
    std::printf("record_trajectories --model=DIR --corpus=FILE.jsonl --out=DIR [--threads=N] "
                "[--max_docs=N]\n");
    return 0;
  }
  const absl::Status s = statecache::Record(*f);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
