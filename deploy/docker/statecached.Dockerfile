# statecached + statecachectl image. Build from the repository root:
#
#   DOCKER_BUILDKIT=1 docker build -f deploy/docker/statecached.Dockerfile -t statecached:0.1.0 .
#
# Stage "build": Debian 12 with the project's Debian packages (.ci/setup.sh)
# and the CUDA 13 toolkit from NVIDIA's Debian 12 repository (nvcc and the
# static runtime; no GPU is needed to build). Stage "runtime": Debian 12 slim
# with only the two binaries and the shared libraries they load (the CUDA
# runtime is linked statically; the driver, libcuda.so, comes from the node
# through the NVIDIA container toolkit). Checked statically by
# deploy/check_packaging.py (//deploy:packaging_test).
ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
ARG CUDA_PACKAGE_VERSION=13-0
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      ca-certificates wget \
 && wget -q -O /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb \
 && apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      cuda-nvcc-${CUDA_PACKAGE_VERSION} cuda-cudart-dev-${CUDA_PACKAGE_VERSION} \
 && rm -rf /var/lib/apt/lists/* /tmp/cuda-keyring.deb \
 && { [ -e /usr/local/cuda ] || ln -s /usr/local/cuda-* /usr/local/cuda; }
WORKDIR /src
COPY .ci/setup.sh .ci/setup.sh
RUN bash .ci/setup.sh && rm -rf /var/lib/apt/lists/*
COPY WORKSPACE BUILD .bazelrc ./
COPY third_party third_party
COPY proto proto
COPY kernels kernels
COPY server server
COPY client client
RUN bazel build -c opt //server:statecached //client/ctl:statecachectl \
 && mkdir -p /out \
 && cp -L bazel-bin/server/statecached bazel-bin/client/ctl/statecachectl /out/

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libabsl20220623 libc-ares2 libcivetweb1 libgrpc++1.51 libgrpc29 libhiredis0.14 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprotobuf32 libre2-9 \
      libssl3 libstdc++6 zlib1g ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/statecached /out/statecachectl /usr/local/bin/
COPY LICENSE /usr/share/doc/statecache/LICENSE
# The uid / gid of deploy/kubernetes/deployment.yaml's securityContext.
USER 65532:65532
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/statecached"]
CMD ["--flagfile=/etc/statecache/statecached.flags"]
