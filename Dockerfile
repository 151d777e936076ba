# twofold's container image: the release binary on a distroless base (glibc, libgcc_s and
# libm are all it links: `ldd target/release/twofold`; NVML, libcuda and the Vulkan loader
# are opened at run time when the node has them). Build:
#   docker build -t ghcr.io/twofold/twofold:0.1.0 .
# Run it as deploy/k8s/ does: host PID namespace, read-only root, capabilities dropped but
# SYS_PTRACE, DAC_READ_SEARCH, FOWNER, BPF and PERFMON, /sys mounted read-only.
#
# tests/host/image.rs builds the final stage below as it is, from a local root file system
# with buildah (no base image can be pulled there), runs it with podman with the
# DaemonSet's flags and checks the count it exports from inside the container.

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG BASE=gcr.io/distroless/cc-debian12

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin twofold \
 && install -D -m 0755 target/release/twofold /out/twofold

# --- the image: everything below is what tests/host/image.rs builds ---
FROM ${BASE}
COPY --from=build /out/twofold /usr/local/bin/twofold
LABEL org.opencontainers.image.title="twofold" \
      org.opencontainers.image.description="How many times is my model in memory, and why? A Prometheus exporter of model files' page cache, copies and CoW pages." \
      org.opencontainers.image.source="https://github.com/twofold/twofold" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"
# Root in the container, with only the capabilities the DaemonSet adds: a non-root user
# would not get them (Kubernetes gives added capabilities to uid 0 only).
USER 0:0
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/twofold"]
CMD ["serve", "--listen=0.0.0.0:9464", "--interval=15s"]
