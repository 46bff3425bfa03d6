"""cc_grpc_proto: C++ (and gRPC) code for one self-contained .proto file.

Runs Debian's /usr/bin/protoc with /usr/bin/grpc_cpp_plugin in a genrule and
wraps the outputs in two cc_librarys:
  <name>_cc_proto  messages      (<stem>.pb.h / .pb.cc)
  <name>_cc_grpc   service stubs (<stem>.grpc.pb.h / .grpc.pb.cc)
Outputs go to $(GENDIR)/<package>/<src path>, so they are included by the
path of the .proto relative to the repository root. The .proto may import
only files under the repository root or Google's well-known types in
/usr/include.
"""

def cc_grpc_proto(name, src):
    stem = src[:-len(".proto")]
    pb = [stem + ".pb.h", stem + ".pb.cc"]
    grpc = [stem + ".grpc.pb.h", stem + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = pb + grpc,
        cmd = " ".join([
            "/usr/bin/protoc",
            "-I.",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin",
            "$(location " + src + ")",
        ]),
    )
    native.cc_library(
        name = name + "_cc_proto",
        srcs = [stem + ".pb.cc"],
        hdrs = [stem + ".pb.h"],
        deps = ["@system_protobuf//:protobuf"],
    )
    native.cc_library(
        name = name + "_cc_grpc",
        srcs = [stem + ".grpc.pb.cc"],
        hdrs = [stem + ".grpc.pb.h"],
        deps = [
            ":" + name + "_cc_proto",
            "@system_grpc//:grpc++",
        ],
    )
