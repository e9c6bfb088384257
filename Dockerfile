# wsmode: WebSocket mode for stateless model servers.
#   docker build -t wsmode .
#   docker run --rm -p 8080:8080 wsmode --upstream http://model-server:8000/v1
# Configuration: flags after the image name, WSMODE_* variables (-e), or a mounted TOML file
# (-v $PWD/wsmode.toml:/etc/wsmode.toml:ro -e WSMODE_CONFIG=/etc/wsmode.toml).
# The image's own defaults (listen on 0.0.0.0:8080, JSON logs) are a base file,
# docker/base.toml: a mounted file, a variable or a flag wins over each of them.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    WSMODE_BASE_CONFIG=/etc/wsmode/base.toml
COPY --from=build /wheels /wheels
COPY docker/base.toml /etc/wsmode/base.toml
COPY docker/healthcheck.py /usr/local/bin/wsmode-healthcheck
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin wsmode \
    && mkdir -p /var/lib/wsmode && chown 10001 /var/lib/wsmode
# a writable place for usage records (WSMODE_USAGE_JSONL_PATH=/var/lib/wsmode/usage.jsonl)
VOLUME /var/lib/wsmode
USER 10001
EXPOSE 8080
# /healthz at the URL the server wrote once it listened (server.listen_file), so --port,
# WSMODE_PORT and a mounted file's port all work
HEALTHCHECK --interval=15s --timeout=3s --start-period=5s \
    CMD ["python", "/usr/local/bin/wsmode-healthcheck", "/tmp/wsmode.listen"]
# SIGTERM (docker stop) drains the server (server.drain_grace_seconds, 30 s by default) and
# exits 0; exec form so wsmode is PID 1 and receives it. Use a longer stop timeout:
# docker stop -t 40, or --stop-timeout 40 on docker run. During the drain /healthz is 503.
STOPSIGNAL SIGTERM
ENTRYPOINT ["wsmode", "serve"]
