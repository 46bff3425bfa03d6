#include "client/cpp/statecache_client.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/statecache_client_wire.h"
#include "kernels/common/status_macros.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace statecache {

using client_wire::AddHandles;
using client_wire::FloatBytes;
using client_wire::FloatsOf;
using client_wire::KeyToWire;
using client_wire::SetHandle;
using client_wire::SetTensor;

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// ---------------------------------------------------------------------------
// StateCacheClient

absl::StatusOr<std::unique_ptr<StateCacheClient>> StateCacheClient::Connect(
    const std::string& target, Options options) {
  if (target.empty()) return absl::InvalidArgumentError("target: empty server address");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  auto channel = grpc::CreateCustomChannel(
      target, options.credentials ? options.credentials : grpc::InsecureChannelCredentials(),
      args);
  if (channel == nullptr) {
    return absl::UnavailableError(absl::StrCat("target: cannot create a channel to ", target));
  }
  return std::unique_ptr<StateCacheClient>(new StateCacheClient(std::move(channel), options));
}

StateCacheClient::StateCacheClient(std::shared_ptr<grpc::Channel> channel, Options options)
    : options_(options), channel_(std::move(channel)), stub_(v1::StateCache::NewStub(channel_)) {}

void StateCacheClient::SetDeadline(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(options_.timeout)));
  if (!options_.bearer_token.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options_.bearer_token);
  }
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> StateCacheClient::TlsCredentials(
    const std::string& root_ca_file, const std::string& cert_file, const std::string& key_file) {
  auto read = [](const std::string& path, absl::string_view field) -> absl::StatusOr<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "'"));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("cert_file / key_file: give both or neither");
  }
  grpc::SslCredentialsOptions ssl;
  if (!root_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, read(root_ca_file, "root_ca_file"));
  }
  if (!cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, read(cert_file, "cert_file"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, read(key_file, "key_file"));
  }
  return grpc::SslCredentials(ssl);
}

absl::Status StateCacheClient::WaitForReady(absl::Duration timeout) {
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(timeout));
  if (!channel_->WaitForConnected(deadline)) {
    return absl::UnavailableError("server: not reachable before the deadline");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> StateCacheClient::CheckHealth(const std::string& service) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(health->Check(&ctx, req, &resp)));
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

absl::StatusOr<v1::ModelInfo> StateCacheClient::RegisterModel(const ModelRegistration& r) {
  v1::RegisterModelRequest req;
  req.set_model_id(r.model_id);
  v1::Geometry* g = req.mutable_geometry();
  g->set_arch(r.geometry.arch == Arch::kKda ? v1::ARCH_KDA : v1::ARCH_GDN);
  g->set_layers(r.geometry.layers);
  g->set_h_qk(r.geometry.h_qk);
  g->set_h_v(r.geometry.h_v);
  g->set_d_k(r.geometry.d_k);
  g->set_d_v(r.geometry.d_v);
  g->set_scale(r.geometry.scale);
  req.set_format(r.format);
  req.mutable_layout()->mutable_key_perm()->Add(r.key_perm.begin(), r.key_perm.end());
  req.mutable_layout()->mutable_value_order()->Add(r.value_order.begin(), r.value_order.end());
  req.mutable_layout()->mutable_value_scale()->Add(r.value_scale.begin(), r.value_scale.end());
  if (!r.layout_file.empty()) req.set_layout_file(r.layout_file);
  req.set_slots(r.slots);
  req.set_checkpoints(r.checkpoints);
  req.set_max_state_bytes(r.max_state_bytes);
  req.set_max_checkpoint_bytes(r.max_checkpoint_bytes);
  req.set_checkpoint_format(r.checkpoint_format);
  v1::RegisterModelResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->RegisterModel(&ctx, req, &resp)));
  absl::MutexLock lock(&mu_);
  geometry_[r.model_id] = r.geometry;
  return resp.model();
}

absl::StatusOr<v1::CalibrateResponse> StateCacheClient::Calibrate(
    const v1::CalibrateSettings& settings, absl::Span<const CalibrationTrajectory> trajectories) {
  v1::CalibrateResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  std::unique_ptr<grpc::ClientWriter<v1::CalibrateRequest>> writer =
      stub_->Calibrate(&ctx, &resp);
  v1::CalibrateRequest first;
  *first.mutable_settings() = settings;
  size_t next = 0;
  if (!trajectories.empty()) {
    first.set_trajectory_file(trajectories[0].file);
    first.set_domain(trajectories[0].domain);
    next = 1;
  }
  bool open = writer->Write(first);
  for (; open && next < trajectories.size(); ++next) {
    v1::CalibrateRequest msg;
    msg.set_trajectory_file(trajectories[next].file);
    msg.set_domain(trajectories[next].domain);
    open = writer->Write(msg);
  }
  // A failed Write means the server already answered; Finish returns why.
  writer->WritesDone();
  RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return resp;  // a registered model's geometry is fetched by Geometry() on first use
}

absl::StatusOr<std::vector<v1::ModelInfo>> StateCacheClient::ListModels() {
  v1::ListModelsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->ListModels(&ctx, v1::ListModelsRequest(), &resp)));
  return std::vector<v1::ModelInfo>(resp.models().begin(), resp.models().end());
}

absl::StatusOr<v1::ModelInfo> StateCacheClient::DescribeModel(absl::string_view model_id) {
  v1::DescribeModelRequest req;
  req.set_model_id(std::string(model_id));
  v1::ModelInfo resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->DescribeModel(&ctx, req, &resp)));
  return resp;
}

absl::Status StateCacheClient::DropModel(absl::string_view model_id, bool force) {
  v1::DropModelRequest req;
  req.set_model_id(std::string(model_id));
  req.set_force(force);
  v1::DropModelResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  {
    absl::MutexLock lock(&mu_);
    geometry_.erase(model_id);
  }
  return FromGrpcStatus(stub_->DropModel(&ctx, req, &resp));
}

absl::StatusOr<ModelGeometry> StateCacheClient::Geometry(absl::string_view model_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = geometry_.find(model_id);
    if (it != geometry_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(v1::ModelInfo info, DescribeModel(model_id));
  ModelGeometry g;
  g.arch = info.geometry().arch() == v1::ARCH_KDA ? Arch::kKda : Arch::kGdn;
  g.layers = info.geometry().layers();
  g.h_qk = info.geometry().h_qk();
  g.h_v = info.geometry().h_v();
  g.d_k = info.geometry().d_k();
  g.d_v = info.geometry().d_v();
  g.scale = info.geometry().scale();
  absl::MutexLock lock(&mu_);
  geometry_[std::string(model_id)] = g;
  return g;
}

absl::StatusOr<std::vector<SlotHandle>> StateCacheClient::AllocateSlots(absl::string_view model_id,
                                                                        int count) {
  v1::AllocateSlotsRequest req;
  req.set_model_id(std::string(model_id));
  req.set_count(count);
  v1::AllocateSlotsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->AllocateSlots(&ctx, req, &resp)));
  std::vector<SlotHandle> out;
  for (const v1::SlotHandle& h : resp.slots()) out.push_back(SlotHandle{h.id(), h.generation()});
  return out;
}

absl::Status StateCacheClient::ReleaseSlots(absl::string_view model_id,
                                            absl::Span<const SlotHandle> slots) {
  v1::ReleaseSlotsRequest req;
  req.set_model_id(std::string(model_id));
  AddHandles(slots, req.mutable_slots());
  v1::ReleaseSlotsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return FromGrpcStatus(stub_->ReleaseSlots(&ctx, req, &resp));
}

absl::Status StateCacheClient::BuildUpdate(absl::string_view model_id, const UpdateCall& in,
                                           v1::UpdateRequest* req) {
  ASSIGN_OR_RETURN(ModelGeometry g, Geometry(model_id));
  const int64_t b = static_cast<int64_t>(in.slots.size());
  req->set_model_id(std::string(model_id));
  req->set_layer(in.layer);
  AddHandles(in.slots, req->mutable_slots());
  SetTensor(req->mutable_q(), in.q.dtype, {b, g.h_qk, g.d_k}, in.q.bytes);
  SetTensor(req->mutable_k(), in.k.dtype, {b, g.h_qk, g.d_k}, in.k.bytes);
  SetTensor(req->mutable_v(), in.v.dtype, {b, g.h_v, g.d_v}, in.v.bytes);
  if (g.arch == Arch::kKda) {
    SetTensor(req->mutable_g(), DType::kFp32, {b, g.h_v, g.d_k}, FloatBytes(in.g));
  } else {
    SetTensor(req->mutable_g(), DType::kFp32, {b, g.h_v}, FloatBytes(in.g));
  }
  SetTensor(req->mutable_beta(), DType::kFp32, {b, g.h_v}, FloatBytes(in.beta));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> StateCacheClient::Update(absl::string_view model_id,
                                                            const UpdateCall& in) {
  v1::UpdateRequest req;
  RETURN_IF_ERROR(BuildUpdate(model_id, in, &req));
  v1::UpdateResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Update(&ctx, req, &resp)));
  return FloatsOf(resp.o(), "o");
}

absl::StatusOr<std::unique_ptr<UpdateStream>> StateCacheClient::OpenUpdateStream() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!options_.bearer_token.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options_.bearer_token);
  }
  auto stream = std::unique_ptr<UpdateStream>(new UpdateStream(this, std::move(ctx)));
  if (stream->stream_ == nullptr) return absl::UnavailableError("UpdateStream: cannot open");
  return stream;
}

absl::StatusOr<std::vector<float>> StateCacheClient::Prefill(absl::string_view model_id,
                                                             const PrefillCall& in) {
  ASSIGN_OR_RETURN(ModelGeometry g, Geometry(model_id));
  const int64_t b = static_cast<int64_t>(in.slots.size());
  const int64_t t = in.tokens;
  v1::PrefillRequest req;
  req.set_model_id(std::string(model_id));
  AddHandles(in.slots, req.mutable_slots());
  v1::PrefillTokens* p = req.mutable_tokens();
  p->set_layer(in.layer);
  SetTensor(p->mutable_q(), in.q.dtype, {b, t, g.h_qk, g.d_k}, in.q.bytes);
  SetTensor(p->mutable_k(), in.k.dtype, {b, t, g.h_qk, g.d_k}, in.k.bytes);
  SetTensor(p->mutable_v(), in.v.dtype, {b, t, g.h_v, g.d_v}, in.v.bytes);
  if (g.arch == Arch::kKda) {
    SetTensor(p->mutable_g(), DType::kFp32, {b, t, g.h_v, g.d_k}, FloatBytes(in.g));
  } else {
    SetTensor(p->mutable_g(), DType::kFp32, {b, t, g.h_v}, FloatBytes(in.g));
  }
  SetTensor(p->mutable_beta(), DType::kFp32, {b, t, g.h_v}, FloatBytes(in.beta));
  p->set_want_output(in.want_output);
  v1::PrefillResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Prefill(&ctx, req, &resp)));
  if (!in.want_output) return std::vector<float>();
  return FloatsOf(resp.o(), "o");
}

absl::Status StateCacheClient::PrefillStates(absl::string_view model_id,
                                             absl::Span<const SlotHandle> slots,
                                             absl::Span<const float> states) {
  ASSIGN_OR_RETURN(ModelGeometry g, Geometry(model_id));
  v1::PrefillRequest req;
  req.set_model_id(std::string(model_id));
  AddHandles(slots, req.mutable_slots());
  SetTensor(req.mutable_states(), DType::kFp32,
            {static_cast<int64_t>(slots.size()), g.layers, g.h_v, g.d_k, g.d_v},
            FloatBytes(states));
  v1::PrefillResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return FromGrpcStatus(stub_->Prefill(&ctx, req, &resp));
}

absl::StatusOr<ExportedState> StateCacheClient::Export(absl::string_view model_id,
                                                       SlotHandle slot) {
  v1::ExportRequest req;
  req.set_model_id(std::string(model_id));
  SetHandle(slot, req.mutable_slot());
  v1::ExportResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Export(&ctx, req, &resp)));
  return ExportedState{resp.tags(), std::move(*resp.mutable_packed())};
}

absl::StatusOr<std::vector<float>> StateCacheClient::Unpack(absl::string_view model_id,
                                                            SlotHandle slot) {
  v1::UnpackRequest req;
  req.set_model_id(std::string(model_id));
  SetHandle(slot, req.mutable_slot());
  return CallUnpack(req);
}

absl::StatusOr<std::vector<float>> StateCacheClient::UnpackCheckpoint(absl::string_view model_id,
                                                                      PrefixKey key,
                                                                      uint64_t lease_id) {
  v1::UnpackRequest req;
  req.set_model_id(std::string(model_id));
  KeyToWire(key, req.mutable_key());
  req.set_lease_id(lease_id);
  return CallUnpack(req);
}

absl::StatusOr<std::vector<float>> StateCacheClient::CallUnpack(const v1::UnpackRequest& req) {
  v1::UnpackResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Unpack(&ctx, req, &resp)));
  if (resp.states().size() % sizeof(float) != 0) {
    return absl::InternalError(absl::StrCat("states: ", resp.states().size(), " bytes"));
  }
  std::vector<float> out(resp.states().size() / sizeof(float));
  std::memcpy(out.data(), resp.states().data(), resp.states().size());
  return out;
}

absl::Status StateCacheClient::Import(absl::string_view model_id, SlotHandle slot,
                                      const ExportedState& state) {
  v1::ImportRequest req;
  req.set_model_id(std::string(model_id));
  SetHandle(slot, req.mutable_slot());
  *req.mutable_tags() = state.tags;
  req.set_packed(state.packed);
  v1::ImportResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return FromGrpcStatus(stub_->Import(&ctx, req, &resp));
}

absl::StatusOr<v1::GetStatsResponse> StateCacheClient::GetStats(absl::string_view model_id) {
  v1::GetStatsRequest req;
  req.set_model_id(std::string(model_id));
  v1::GetStatsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->GetStats(&ctx, req, &resp)));
  return resp;
}

// ---------------------------------------------------------------------------
// UpdateStream

UpdateStream::UpdateStream(StateCacheClient* client, std::unique_ptr<grpc::ClientContext> ctx)
    : client_(client), ctx_(std::move(ctx)) {
  stream_ = client_->stub_->UpdateStream(ctx_.get());
}

UpdateStream::~UpdateStream() {
  if (!finished_ && stream_ != nullptr) {
    ctx_->TryCancel();
    (void)stream_->Finish();
  }
}

absl::Status UpdateStream::Send(absl::string_view model_id, const UpdateCall& in,
                                uint64_t sequence) {
  if (finished_) return absl::FailedPreconditionError("UpdateStream: already finished");
  v1::UpdateRequest req;
  RETURN_IF_ERROR(client_->BuildUpdate(model_id, in, &req));
  req.set_sequence(sequence);
  if (!stream_->Write(req)) {
    return absl::UnavailableError("UpdateStream: the stream is closed (call Finish for why)");
  }
  return absl::OkStatus();
}

absl::StatusOr<UpdateStream::Response> UpdateStream::Receive() {
  v1::UpdateResponse resp;
  if (!stream_->Read(&resp)) {
    return absl::UnavailableError("UpdateStream: the stream is closed (call Finish for why)");
  }
  Response out;
  out.sequence = resp.sequence();
  if (resp.has_error() && resp.error().code() != 0) {
    out.o = absl::Status(static_cast<absl::StatusCode>(resp.error().code()),
                         resp.error().message());
  } else {
    out.o = FloatsOf(resp.o(), "o");
  }
  return out;
}

absl::StatusOr<std::vector<float>> UpdateStream::Update(absl::string_view model_id,
                                                        const UpdateCall& in) {
  const uint64_t seq = next_sequence_++;
  RETURN_IF_ERROR(Send(model_id, in, seq));
  ASSIGN_OR_RETURN(Response r, Receive());
  if (r.sequence != seq) {
    return absl::InternalError(absl::StrCat("UpdateStream: response ", r.sequence,
                                            " out of order (expected ", seq, ")"));
  }
  return std::move(r.o);
}

absl::Status UpdateStream::Finish() {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  stream_->WritesDone();
  return FromGrpcStatus(stream_->Finish());
}

}  // namespace statecache
