// Fuzz target: the layout-file parser (kernels/layout/layout_file.h). A file
// that parses must describe a valid StateLayout that serializes again.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/layout/layout_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<statecache::LayoutFile> f = statecache::ParseLayout(
      std::string(reinterpret_cast<const char*>(data), size), nullptr, nullptr);
  if (!f.ok()) return 0;
  // Round trip: what parsed serializes and parses to the same layout.
  absl::StatusOr<std::string> again = statecache::SerializeLayout(f->layout, f->info, f->scores);
  if (!again.ok()) return 0;  // e.g. info keys that only the parser tolerates
  absl::StatusOr<statecache::LayoutFile> back = statecache::ParseLayout(*again, nullptr, nullptr);
  if (!back.ok() || back->layout.Fingerprint() != f->layout.Fingerprint()) std::abort();
  return 0;
}
