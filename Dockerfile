# The relay as a small image: `docker build -t relay .`, then
#   docker run -d -p 7777:7777 -v relay-data:/data relay
# Configuration: mount a TOML file and pass `serve --config FILE`, and/or set RELAY_<SECTION>__<KEY> variables.
# RELAY_SERVER__HOST and RELAY_STORE__PATH below override the file (environment beats file); change them with -e.

# Same minor version as CI (pyproject: requires-python >= 3.11).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the relay and its dependencies into a venv (downloads from PyPI only) ------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN python -m venv /opt/relay
COPY pyproject.toml README.md ./
COPY relay ./relay
RUN /opt/relay/bin/pip install --no-cache-dir . \
 && /opt/relay/bin/relay --help > /dev/null

# --- runtime: the venv, a non-root user and the /data volume ---------------------------------------------
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 relay \
 && useradd --system --uid 10001 --gid relay --home-dir /data --no-create-home --shell /usr/sbin/nologin relay \
 && mkdir /data \
 && chown relay:relay /data
COPY --from=build /opt/relay /opt/relay
# Listen on every interface of the container; keep the database (and its node key, relay.db.key) on the volume.
ENV PATH=/opt/relay/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RELAY_SERVER__HOST=0.0.0.0 \
    RELAY_STORE__PATH=/data/relay.db \
    RELAY_LOG__FORMAT=json
VOLUME ["/data"]
WORKDIR /data
USER 10001:10001
EXPOSE 7777
# GET /health answers 200 "ok" while the relay serves; no curl in the image, Python's urllib does it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('RELAY_SERVER__PORT', '7777'), timeout=4)"]
ENTRYPOINT ["relay"]
CMD ["serve"]
