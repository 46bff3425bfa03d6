#include "client/model/record.h"

#include "kernels/common/status_macros.h"

namespace statecache {

absl::StatusOr<Trajectory> RecordTrajectory(const LanguageModel& model, RecurrentStateStore* store,
                                            const Document& doc, absl::string_view source,
                                            RecurrentMode mode) {
  if (doc.bytes.empty()) return absl::InvalidArgumentError("document: empty");
  ModelSession session(&model, store);
  RETURN_IF_ERROR(session.Reset());
  ForwardTrace trace;
  RETURN_IF_ERROR(session.Forward(doc.bytes, mode, /*logits=*/nullptr, &trace));
  Trajectory t;
  t.geometry = model.config().Geometry();
  t.tokens = static_cast<int>(doc.bytes.size());
  t.domain = doc.domain;
  t.source = std::string(source);
  for (auto& l : trace.layers) {
    LayerInputs in;
    in.q = std::move(l.q);
    in.k = std::move(l.k);
    in.v = std::move(l.v);
    in.g = std::move(l.g);
    in.beta = std::move(l.beta);
    t.layers.push_back(std::move(in));
  }
  RETURN_IF_ERROR(t.Validate());
  return t;
}

}  // namespace statecache
