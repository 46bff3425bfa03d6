// memory_table: prints the README's "memory per request" markdown table.
//
// Bytes of one request's recurrent states (one slot: every GDN/KDA layer and
// value head) for real models in every storage format, computed by the
// server's own size function (StateLayout::slot_bytes = layers * h_v *
// MakeHeadLayout(spec, d_k, d_v).head_bytes), plus how many requests a fixed
// state budget holds. Models (d_k = d_v = 128):
//   Qwen3.6-35B-A3B  30 GDN layers, 16 key / 32 value heads
//   Kimi-Linear-48B  20 KDA layers, 32 heads
//   Qwen3.8-27B      48 GDN layers, 16 key / 48 value heads
// (h_qk does not change the state size.)
//
//   bazel run //deploy:memory_table -- --budget_gib=64
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/formats/format.h"
#include "kernels/layout/geometry.h"
#include "kernels/layout/state_layout.h"

ABSL_FLAG(double, budget_gib, 64.0, "State budget (GiB) for the 'requests per budget' columns.");

namespace statecache {
namespace {

struct Model {
  const char* name;
  ModelGeometry geometry;
};

std::vector<Model> Models() {
  return {
      {"Qwen3.6-35B-A3B", {Arch::kGdn, 30, 16, 32, 128, 128, 0.0f}},
      {"Kimi-Linear-48B", {Arch::kKda, 20, 32, 32, 128, 128, 0.0f}},
      {"Qwen3.8-27B", {Arch::kGdn, 48, 16, 48, 128, 128, 0.0f}},
  };
}

std::string Commas(int64_t n) {
  std::string s = absl::StrCat(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(i, ",");
  return s;
}

int Main() {
  const double budget = absl::GetFlag(FLAGS_budget_gib) * 1024.0 * 1024.0 * 1024.0;
  const std::vector<Model> models = Models();
  std::string head = "| format | bits/value | bytes/head |";
  std::string rule = "|---|---|---|";
  for (const Model& m : models) {
    absl::StrAppend(&head, " ", m.name, " MiB/request |");
    absl::StrAppend(&rule, "---|");
  }
  absl::StrAppend(&head, " vs fp32 |");
  absl::StrAppend(&rule, "---|");
  for (const Model& m : models) {
    absl::StrAppend(&head, " ", m.name, " requests/", absl::GetFlag(FLAGS_budget_gib), " GiB |");
    absl::StrAppend(&rule, "---|");
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
  for (StateFormat f : AllStateFormats()) {
    const FormatSpec spec{f, IsMixedFormat(f) ? kDefaultKHi : 0};
    std::string row;
    std::vector<int64_t> slot_bytes;
    double bits = 0, ratio = 0;
    int64_t head_bytes = 0;
    for (const Model& m : models) {
      absl::StatusOr<StateLayout> layout = StateLayout::Identity(m.geometry, spec);
      absl::StatusOr<StateLayout> fp32 =
          StateLayout::Identity(m.geometry, FormatSpec{StateFormat::kFp32, 0});
      if (!layout.ok() || !fp32.ok()) {
        std::fprintf(stderr, "memory_table: %s: %s\n", m.name,
                     (layout.ok() ? fp32.status() : layout.status()).ToString().c_str());
        return 1;
      }
      slot_bytes.push_back(layout->slot_bytes());
      bits = layout->head_layout().PayloadBitsPerValue();
      head_bytes = layout->head_layout().head_bytes;
      ratio = static_cast<double>(layout->slot_bytes()) / fp32->slot_bytes();
    }
    absl::StrAppend(&row, "| ", FormatSpecName(spec), " | ", absl::StrFormat("%.3f", bits), " | ",
                    Commas(head_bytes), " |");
    for (int64_t b : slot_bytes) {
      absl::StrAppend(&row, " ", absl::StrFormat("%.2f", b / (1024.0 * 1024.0)), " |");
    }
    absl::StrAppend(&row, " ", absl::StrFormat("%.1f%%", 100.0 * ratio), " |");
    for (int64_t b : slot_bytes) {
      absl::StrAppend(&row, " ", Commas(static_cast<int64_t>(budget / b)), " |");
    }
    std::printf("%s\n", row.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace statecache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return statecache::Main();
}
