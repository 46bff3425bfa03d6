"""grpc.health.v1 Health.Check without the grpcio-health-checking package.

grpcio-health-checking X.Y requires grpcio >= X.Y, so depending on it would
make pip upgrade a serving stack's pinned grpcio. The two messages of
grpc/health/v1/health.proto that Check uses are declared here, in a private
descriptor pool (no clash with grpc_health when both are imported), and
serialize to the same bytes.
"""
from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2, descriptor_pool

SERVING = 1  # HealthCheckResponse.ServingStatus.SERVING
CHECK_METHOD = "/grpc.health.v1.Health/Check"


@functools.lru_cache(maxsize=None)
def messages():
    """(HealthCheckRequest, HealthCheckResponse) message classes."""
    from statecache._pbload import load_file
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto",
                                            package="grpc.health.v1", syntax="proto3")
    fd.message_type.add(name="HealthCheckRequest").field.add(
        name="service", number=1, label=F.LABEL_OPTIONAL, type=F.TYPE_STRING)
    resp = fd.message_type.add(name="HealthCheckResponse")
    status = resp.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    resp.field.add(name="status", number=1, label=F.LABEL_OPTIONAL, type=F.TYPE_ENUM,
                   type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    ns: dict = {}
    load_file(fd.SerializeToString(), ns, descriptor_pool.DescriptorPool())
    return ns["HealthCheckRequest"], ns["HealthCheckResponse"]


def check_callable(channel):
    """channel.unary_unary for Health.Check (a grpc.Channel or grpc.aio.Channel)."""
    request, response = messages()
    return channel.unary_unary(CHECK_METHOD, request_serializer=request.SerializeToString,
                               response_deserializer=response.FromString)
