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
ENV COMPACTION_PROXY_CONFIG=/app/config.yml
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2).status == 200 else 1)"]
CMD ["compaction-proxy", "serve", "--host", "0.0.0.0", "--port", "8080"]
