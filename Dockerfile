# The gpuscaler operator image: `gpuscaler run` (kopf) with the catalog data, as a non-root user.
# Build: docker build -t ghcr.io/gpuscaler/gpuscaler:0.1.0 .   (see helm/gpuscaler/README.md)

# ---- builder: a virtualenv with gpuscaler and its operator extras (kopf, kubernetes, prometheus-client)
# plus the extras of the chosen providers and features: aws (eks: boto3), gcp (gke:
# google-cloud-container), observe (Prometheus-observed performance: prometheus-api-client).
# Example: docker build --build-arg EXTRAS=operator,aws,observe -t ghcr.io/gpuscaler/gpuscaler:0.1.0-eks .
# Every distribution is pinned by constraints.txt (scripts/lock_image.py, from the tested venv;
# docs/security.md): PIP_CONSTRAINT applies to the install and to pip's isolated build environment.
FROM python:3.11-slim-bookworm AS builder
ARG EXTRAS=operator,aws,gcp,observe
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CONSTRAINT=/src/constraints.txt
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operator/ operator/
RUN pip install ".[${EXTRAS}]" && gpuscaler --version

# ---- runtime: the virtualenv only; no compilers, no pip cache, no source tree
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="gpuscaler" \
      org.opencontainers.image.description="Cost-aware GPU autoscaling of deep-learning training on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The chart runs it with runAsUser 65532 and a read-only root filesystem (/tmp is an emptyDir).
RUN groupadd --gid 65532 gpuscaler && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gpuscaler
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["gpuscaler"]
CMD ["run"]
