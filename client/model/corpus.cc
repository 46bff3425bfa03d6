#include "client/model/corpus.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/io/json.h"

namespace statecache {

absl::StatusOr<std::vector<Document>> ParseCorpus(absl::string_view jsonl) {
  std::vector<Document> docs;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(jsonl, '\n')) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("corpus line ", line_no, ": ", why));
    };
    auto v = ParseJson(line);
    if (!v.ok()) return bad(v.status().message());
    if (!v->is_object()) return bad("not a JSON object");
    const JsonValue* domain = v->Find("domain");
    const JsonValue* text = v->Find("text");
    if (domain == nullptr || !domain->is_string()) return bad("domain: missing or not a string");
    if (text == nullptr || !text->is_string()) return bad("text: missing or not a string");
    auto cps = DecodeUtf8ToCodePoints(text->string_value());
    if (!cps.ok()) return bad(absl::StrCat("text: ", cps.status().message()));
    Document d;
    d.domain = domain->string_value();
    d.bytes.reserve(cps->size());
    for (size_t i = 0; i < cps->size(); ++i) {
      if ((*cps)[i] > 255) {
        return bad(absl::StrCat("text: code point U+", absl::Hex((*cps)[i]), " at ", i,
                                " is not a byte (Latin-1 expected)"));
      }
      d.bytes.push_back(static_cast<int32_t>((*cps)[i]));
    }
    docs.push_back(std::move(d));
  }
  return docs;
}

absl::StatusOr<std::vector<Document>> ReadCorpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("corpus: cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto docs = ParseCorpus(ss.str());
  if (!docs.ok()) {
    return absl::Status(docs.status().code(), absl::StrCat(path, ": ", docs.status().message()));
  }
  return docs;
}

}  // namespace statecache
