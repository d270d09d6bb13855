# syntax=docker/dockerfile:1
# hydrator container image. Build: docker build -t hydrator:0.1.0 .
#   or: podman build --format docker -t hydrator:0.1.0 .   (podman's default OCI format has no
#   HEALTHCHECK and drops it; scripts/image builds it this way, as the tests do)
# Run:   docker run -v /path/hydrator.toml:/etc/hydrator/hydrator.toml:ro \
#          -v hydrator-state:/var/lib/hydrator -p 9620:9620 hydrator:0.1.0
# (the config must set [http] listen = "0.0.0.0:9620" to be reachable from outside the container).
# Base images pinned by tag; pin by digest (FROM python:3.11-slim-bookworm@sha256:...) where your
# registry policy asks for it.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, at the exact versions of the lock (deploy/docker/lock.py), so source edits
# do not invalidate this layer.
COPY deploy/docker/constraints.txt /src/constraints.txt
RUN python -m venv /opt/hydrator \
    && /opt/hydrator/bin/pip install --requirement constraints.txt
COPY pyproject.toml README.md /src/
COPY hydrator /src/hydrator
RUN /opt/hydrator/bin/pip install --no-deps --constraint constraints.txt . \
    && /opt/hydrator/bin/pip check

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="hydrator" \
      org.opencontainers.image.description="Data-locality attributes for HTCondor pools" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 hydrator \
    && useradd --system --uid 10001 --gid hydrator --no-create-home \
       --home-dir /var/lib/hydrator --shell /usr/sbin/nologin hydrator \
    && install -d -o hydrator -g hydrator -m 0750 /var/lib/hydrator \
    && install -d -m 0755 /etc/hydrator
COPY --from=build /opt/hydrator /opt/hydrator
COPY deploy/docker/healthcheck.py /usr/local/bin/hydrator-healthcheck
ENV PATH=/opt/hydrator/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HYDRATOR_CONFIG=/etc/hydrator/hydrator.toml
VOLUME ["/var/lib/hydrator"]
USER 10001:10001
WORKDIR /var/lib/hydrator
EXPOSE 9620
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "/usr/local/bin/hydrator-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["hydrator"]
CMD ["run"]
