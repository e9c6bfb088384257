# wsmode: WebSocket mode for stateless model servers.
#   docker build -t wsmode .
#   docker run --rm -p 8080:8080 wsmode --upstream http://model-server:8000/v1
# Configuration: flags after the image name, WSMODE_* variables (-e), or a mounted TOML file
# (-v $PWD/wsmode.toml:/etc/wsmode.toml:ro -e WSMODE_CONFIG=/etc/wsmode.toml).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    WSMODE_HOST=0.0.0.0 WSMODE_PORT=8080 WSMODE_SERVER_LOG_FORMAT=json
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin wsmode \
    && mkdir -p /var/lib/wsmode && chown 10001 /var/lib/wsmode
# a writable place for usage records (WSMODE_USAGE_JSONL_PATH=/var/lib/wsmode/usage.jsonl)
VOLUME /var/lib/wsmode
USER 10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=5s \
    CMD python -c "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('WSMODE_PORT','8080'), timeout=2)"
# SIGTERM (docker stop) drains the server (server.drain_grace_seconds, 30 s by default) and
# exits 0; exec form so wsmode is PID 1 and receives it. Use a longer stop timeout:
# docker stop -t 40, or --stop-timeout 40 on docker run. During the drain /healthz is 503.
STOPSIGNAL SIGTERM
ENTRYPOINT ["wsmode", "serve"]
