# syntax=docker/dockerfile:1
# The redlock-operator image: one static binary as entrypoint, `run` (the controller) as default command.
#   docker build --build-arg REDLOCK_COMMIT=$(git rev-parse HEAD) -t localhost/redlock-operator:0.2.0 .
#   docker run --rm localhost/redlock-operator:0.2.0 --version
# Other subcommands: `crd` prints the CRDs; `lock`, `elect` and `guard` run a command under a lock (the binary
# links no shared library, so it runs in any image: the chart can inject it, or copy it into yours).
# scripts/image-archive.py builds the same image without a daemon (scripts/release.sh's image archive), from the
# last stage below as written: it refuses an instruction there it has no mapping for, and tests/image.rs checks
# the two agree (docs/contributing/testing.md).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
# The commit `--version` names (the build context has no .git): --build-arg REDLOCK_COMMIT=$(git rev-parse HEAD).
ARG REDLOCK_COMMIT
WORKDIR /src
COPY . .
# Static: only the final binary is linked with crt-static (glibc 2.36 of bookworm: its files and dns name lookups
# are inside libc, so /etc/hosts and DNS, Service names included, still resolve), nothing else is rebuilt. The
# cache mounts keep the registry and compiled dependencies between builds (BuildKit). /out/tmp is the image's /tmp.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo rustc --release --locked --bin redlock-operator -- -C target-feature=+crt-static \
    && install -D -m 0755 target/release/redlock-operator /out/redlock-operator \
    && mkdir -m 1777 /out/tmp

# Nothing but the binary, a CA bundle (for rediss:// masters without --redis-ca), the users and /tmp: no shell,
# no package manager, no library, nothing for an intruder to use. Runs as 65532 ("nonroot", numeric so that the
# kubelet can check runAsNonRoot); the chart adds a read-only root filesystem.
FROM scratch
LABEL org.opencontainers.image.title="redlock-operator" \
      org.opencontainers.image.description="Redlock distributed locks for Kubernetes and for the shell" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY <<EOF /etc/passwd
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin
EOF
COPY <<EOF /etc/group
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
# Host names from /etc/hosts first, then DNS (glibc's default without this file asks DNS first).
COPY <<EOF /etc/nsswitch.conf
passwd: files
group: files
hosts: files dns
EOF
COPY --from=build /out/tmp /tmp
COPY --from=build /out/redlock-operator /usr/local/bin/redlock-operator
USER 65532:65532
# 8080: /metrics, /healthz and /readyz (--metrics-addr); 8443: holders' hand-over reports over TLS (--reports-addr).
EXPOSE 8080 8443
ENTRYPOINT ["/usr/local/bin/redlock-operator"]
CMD ["run"]
