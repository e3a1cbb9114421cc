# The operator and runtime images from source, with a container engine:
#
#   docker build --target operator -t ghcr.io/ebbflow/ebbflow-operator:0.1.0 .
#   docker build --target runtime  -t ghcr.io/ebbflow/ebbflow-runtime:0.1.0 .
#   docker build --target runtime-python -t ghcr.io/ebbflow/ebbflow-runtime-python:0.1.0 .
#
# Without one, scripts/build-images.sh builds the same two images (same binaries, user, paths,
# entrypoint and command) as OCI archives from a release build on this machine; operator/tests/
# image.rs checks those archives and runs their binaries as the pods' user.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ebbflow-operator -p ebbflow-job --features ebbflow-operator/ec2 --bins \
 && mkdir -p /out \
 && objcopy --strip-debug target/release/ebbflow-operator /out/ebbflow-operator \
 && objcopy --strip-debug target/release/ebbflow /out/ebbflow

# glibc, libgcc_s, CA certificates and the nonroot user (65532) the pods run as.
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/ebbflow-operator /usr/local/bin/ebbflow-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ebbflow-operator"]

# Runtime pods run `ebbflow pod` (the operator sets the command).
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /out/ebbflow /usr/local/bin/ebbflow
# A fixed malloc mmap threshold keeps a node's memory near its heap (NODE_MALLOC_TUNABLES in
# operator/job/src/run/instances.rs).
ENV PATH=/usr/local/bin:/usr/bin:/bin GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072
USER 65532:65532
CMD ["ebbflow", "pod"]

# Runtime pods of Python apps (kind: Python): `ebbflow` built with the python feature against
# Debian's CPython 3.11 (the extension ABI of python:3.11), plus numpy, the SDK's Python part
# (its native part is in the binary) and the examples. Your model's image: FROM this one, COPY
# your code, and name its directory in spec.app.python.path. scripts/build-images.sh builds the
# same image without an engine (with EBBFLOW_PYTHON set).
FROM rust:1.95-bookworm AS build-python
RUN apt-get update && apt-get install -y --no-install-recommends python3-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    PYO3_PYTHON=/usr/bin/python3 cargo build --release --locked -p ebbflow-job --features python --bin ebbflow \
 && mkdir -p /out \
 && objcopy --strip-debug target/release/ebbflow /out/ebbflow

FROM python:3.11-slim-bookworm AS runtime-python
RUN pip install --no-cache-dir numpy
COPY python/ebbflow /opt/ebbflow/python/ebbflow
COPY examples/python /opt/ebbflow/examples
COPY --from=build-python /out/ebbflow /usr/local/bin/ebbflow
ENV PYTHONPATH=/opt/ebbflow/python PYTHONDONTWRITEBYTECODE=1 \
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072
USER 65532:65532
CMD ["ebbflow", "pod"]
