# syntax=docker/dockerfile:1
# The redlock-operator image: the binary as entrypoint, `run` (the controller) as default command.
#   docker build -t redlock-operator:0.1.0 .
#   docker run --rm redlock-operator:0.1.0 --help
# Other subcommands: `crd` prints the CRDs; `lock` runs a command under a lock (copy the binary into your own
# image for that: this one has no shell and no other programs).
# scripts/build-images.sh builds the same image without a daemon for the end-to-end tests, from the runtime stage
# below as written: it refuses an instruction there it has no mapping for (docs/contributing/testing.md).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and compiled dependencies between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin redlock-operator \
    && install -D -m 0755 target/release/redlock-operator /out/redlock-operator

# distroless/cc: glibc and libgcc of the same Debian release as the builder, CA certificates and a non-root user
# (65532, "nonroot") — nothing else: no shell, no package manager, nothing for an intruder to use. The binary
# needs no more (TLS is rustls, no OpenSSL). The chart runs it as 65532 with a read-only root filesystem.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="redlock-operator" \
      org.opencontainers.image.description="Redlock distributed locks for Kubernetes and for the shell" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/redlock-operator /usr/local/bin/redlock-operator
USER nonroot:nonroot
# /metrics, /healthz and /readyz (--metrics-addr).
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/redlock-operator"]
CMD ["run"]
