// Corpus documents: JSON lines {"domain": str, "text": str} where text holds
// raw bytes as Latin-1 code points (../shared/corpus/README.md).
//
//   ASSIGN_OR_RETURN(std::vector<Document> docs, ReadCorpus(path));
//   docs[0].bytes   // one token per byte, values 0..255
#ifndef STATECACHE_CLIENT_MODEL_CORPUS_H_
#define STATECACHE_CLIENT_MODEL_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace statecache {

struct Document {
  std::string domain;
  std::vector<int32_t> bytes;  // tokens: the document's bytes, 0..255
};

// Parses JSON-lines text (blank lines skipped). kInvalidArgument naming the
// line for bad JSON, a missing/non-string field, or a code point above 255.
absl::StatusOr<std::vector<Document>> ParseCorpus(absl::string_view jsonl);
// Reads and parses a file; kNotFound when missing.
absl::StatusOr<std::vector<Document>> ReadCorpus(const std::string& path);

}  // namespace statecache

#endif  // STATECACHE_CLIENT_MODEL_CORPUS_H_
