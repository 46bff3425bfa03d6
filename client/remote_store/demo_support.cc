#include "client/remote_store/demo_support.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/status_macros.h"
#include "kernels/io/test_data.h"

namespace statecache {
namespace {

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::StatusOr<DemoData> LoadDemoData(const std::string& model, int threads) {
  DemoData d;
  std::string dir = model;
  if (model.find('/') == std::string::npos || !IsDir(model)) {
    ASSIGN_OR_RETURN(dir, SharedDataPath(absl::StrCat("models/", model)));
  }
  const size_t slash = dir.find_last_of('/');
  d.model_name = slash == std::string::npos ? dir : dir.substr(slash + 1);
  LanguageModel::Options options;
  options.threads = threads;
  ASSIGN_OR_RETURN(d.model, LanguageModel::Load(dir, options));
  ASSIGN_OR_RETURN(std::string heldout, SharedDataPath("corpus/heldout.jsonl"));
  ASSIGN_OR_RETURN(d.heldout, ReadCorpus(heldout));
  ASSIGN_OR_RETURN(std::string calibration, SharedDataPath("corpus/calibration.jsonl"));
  ASSIGN_OR_RETURN(d.calibration, ReadCorpus(calibration));
  return d;
}

absl::StatusOr<ServerHandle> StartOrConnect(const ServerSetup& setup) {
  ServerHandle h;
  std::string address = setup.server;
  if (address.empty()) {
    ChildServer::Options o;
    ASSIGN_OR_RETURN(o.binary, FindStatecached(setup.statecached));
    o.args = {absl::StrCat("--backend=", setup.backend),
              absl::StrCat("--state_memory_bytes=", setup.state_memory_bytes),
              absl::StrCat("--checkpoint_memory_bytes=", setup.checkpoint_memory_bytes)};
    o.args.insert(o.args.end(), setup.extra_args.begin(), setup.extra_args.end());
    ASSIGN_OR_RETURN(h.child, ChildServer::Start(o));
    address = h.child->address();
  }
  ASSIGN_OR_RETURN(h.client, StateCacheClient::Connect(address));
  RETURN_IF_ERROR(h.client->WaitForReady(absl::Seconds(10)));
  ASSIGN_OR_RETURN(v1::GetStatsResponse stats, h.client->GetStats());
  if (h.child != nullptr) {
    h.description = absl::StrCat("child statecached (pid ", h.child->pid(), ", ", stats.backend(),
                                 " backend) on ", address);
  } else {
    h.description = absl::StrCat("statecached at ", address, " (", stats.backend(), " backend, ",
                                 stats.version(), ")");
  }
  return h;
}

absl::StatusOr<v1::ModelInfo> RegisterLayout(StateCacheClient* client, const std::string& base_id,
                                             const StateLayout& layout, const Registration& reg) {
  ModelRegistration r;
  r.geometry = layout.geometry();
  r.format = FormatSpecName(layout.format());
  if (!reg.layout_file.empty()) {
    r.layout_file = reg.layout_file;
  } else {
    if (!layout.identity_key_perm()) r.key_perm = layout.all_key_perms();
    if (layout.format().format == StateFormat::kDampSr) {
      r.key_perm = layout.all_key_perms();
      r.value_order = layout.all_value_orders();
      r.value_scale = layout.all_value_scales();
    }
  }
  r.slots = reg.slots;
  r.checkpoints = reg.checkpoints;
  r.max_checkpoint_bytes = reg.max_checkpoint_bytes;
  r.checkpoint_format = reg.checkpoint_format;
  for (int attempt = 1; attempt <= 100; ++attempt) {
    r.model_id = attempt == 1 ? base_id : absl::StrCat(base_id, "-", attempt);
    absl::StatusOr<v1::ModelInfo> info = client->RegisterModel(r);
    if (!absl::IsAlreadyExists(info.status())) return info;
  }
  return absl::AlreadyExistsError(
      absl::StrCat("model_id: ", base_id, " and 99 suffixed variants are all registered"));
}

std::string Thousands(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.2f %s", bytes, units[u]);
}

}  // namespace statecache
