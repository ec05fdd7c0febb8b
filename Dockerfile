# syntax=docker/dockerfile:1
# compaction-proxy: slim, non-root, token encodings inside the package (no download at run time).
# BASE_IMAGE: any Debian-like image with python3 (3.11 or later) and its venv module; by default
# the official Python image. CI builds it on a Debian base made with mmdebstrap (.ci/image).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY policies ./policies
COPY replay ./replay
# A CA bundle for pip when the build's network needs one: given as the build secret pip-cert
# (podman/docker build --secret id=pip-cert,src=FILE), mounted for this step only, in no layer.
RUN --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check .

FROM ${BASE_IMAGE}
# A user of its own: Debian's base already has a system user named proxy.
RUN useradd --system --uid 10001 --home-dir /app --create-home compaction
COPY --from=build /opt/venv /opt/venv
COPY config.yml /app/config.yml
WORKDIR /app
USER 10001
# Every interface inside the container. The port is the config's (server.port) or
# -e COMPACTION_PROXY_PORT=...: `serve` and `healthcheck` read both, so the check follows it.
ENV PATH=/opt/venv/bin:$PATH \
    COMPACTION_PROXY_CONFIG=/app/config.yml \
    COMPACTION_PROXY_HOST=0.0.0.0
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["compaction-proxy", "healthcheck"]
CMD ["compaction-proxy", "serve"]
