# syntax=docker/dockerfile:1
# compaction-proxy: slim, non-root, token encodings inside the package (no download at run time).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY policies ./policies
COPY replay ./replay
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /app --create-home proxy
COPY --from=build /install /usr/local
COPY config.yml /app/config.yml
WORKDIR /app
USER 10001
# Every interface inside the container. The port is the config's (server.port) or
# -e COMPACTION_PROXY_PORT=...: `serve` and `healthcheck` read both, so the check follows it.
ENV COMPACTION_PROXY_CONFIG=/app/config.yml \
    COMPACTION_PROXY_HOST=0.0.0.0
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["compaction-proxy", "healthcheck"]
CMD ["compaction-proxy", "serve"]
