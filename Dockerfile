# kvgate: multi-stage build (builder, then a slim runtime running as a non-root user).
#   docker build -t kvgate .
#   docker run -p 8080:8080 -p 127.0.0.1:9090:9090 \
#     -v "$PWD/my-kvgate.toml:/etc/kvgate/kvgate.toml:ro" kvgate
# Relative paths in a mounted config resolve against /etc/kvgate, where the shipped
# tokenizers live (/etc/kvgate/tokenizers/<model>/). Bind server.listen to 0.0.0.0 inside
# the container. The image has no /etc/kvgate/kvgate.toml of its own: mount one (Kubernetes:
# the ConfigMap of deploy/kubernetes/). No HEALTHCHECK: the image has no HTTP client (curl)
# to probe /ready with; Kubernetes probes the admin port itself (deploy/kubernetes/).

FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY gateway gateway
COPY crates crates
COPY benches benches
RUN cargo build --release --locked --bin kvgate \
 && strip target/release/kvgate

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 kvgate \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin kvgate
COPY --from=builder /src/target/release/kvgate /usr/local/bin/kvgate
COPY config/ /etc/kvgate/
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/kvgate"]
CMD ["serve", "--config", "/etc/kvgate/kvgate.toml"]
