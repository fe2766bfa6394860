# perfmodel's prediction service. CPU image by default; a CUDA image by build arguments:
#
#   docker build -t perfmodel .                                                   # CPU (torch pinned to the CPU wheel)
#   docker build -t perfmodel:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 \
#     --build-arg TORCH_CONSTRAINTS= --build-arg TORCH_INDEX_URL= .               # CUDA (PyPI's CUDA torch)
#
#   docker run --rm -p 8000:8000 -v perfmodel-data:/data \
#     -e PERFMODEL_TOKEN_SHA256=$(docker run --rm perfmodel perfmodel serve --hash-token "$TOKEN") \
#     perfmodel                                                                   # serves on :8000, /healthz
#   docker run --rm --gpus all -p 8000:8000 -e PERFMODEL_TOKEN_SHA256=... perfmodel:cuda
#   docker run --rm perfmodel perfmodel zoo list                                  # any other perfmodel command
#
# The write token: the server listens on 0.0.0.0 in the container, so it refuses to start with writes open. Give it
# the SHA-256 of a token (never the token itself) in PERFMODEL_TOKEN_SHA256 (comma-separated for several; the
# `--hash-token` line above prints it); clients then send "Authorization: Bearer $TOKEN" to register jobs, post
# observations and promote models. Reads stay open (PERFMODEL_READ_REQUIRES_TOKEN=true closes them too). On a
# network where anyone may write, say so explicitly: -e PERFMODEL_ALLOW_OPEN_WRITES=true.
#
# Runtime settings are PERFMODEL_* environment variables (`-e PERFMODEL_STORE_URL=postgresql+psycopg://...`).
# The profile store defaults to SQLite under PERFMODEL_HOME=/data; the shipped models are in /app/models.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# TORCH_CONSTRAINTS pins torch/torchvision (constraints-cpu.txt: the CPU wheels, served by TORCH_INDEX_URL, so no
# CUDA packages are pulled). Empty both for a CUDA base: pip then installs PyPI's CUDA build of torch.
ARG TORCH_CONSTRAINTS=constraints-cpu.txt
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    PERFMODEL_HOME=/data PERFMODEL_MODELS_DIR=/app/models

# CUDA runtime bases have no Python: take the distribution's (Ubuntu 22.04: 3.10). python:*-slim has its own.
RUN if ! command -v python3 >/dev/null 2>&1; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv

WORKDIR /app
COPY pyproject.toml README.md constraints-cpu.txt ./
COPY perfmodel ./perfmodel
COPY service ./service
RUN pip install ${TORCH_CONSTRAINTS:+-c "$TORCH_CONSTRAINTS"} ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} . \
 && rm -rf /app/build /app/*.egg-info
# The registry's default is the checkout's models/ folder, which an installed package has not: PERFMODEL_MODELS_DIR
# (above) points it here.
COPY models ./models

RUN useradd --create-home --uid 10001 --user-group perfmodel \
 && mkdir -p /data && chown perfmodel:perfmodel /data
USER perfmodel
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["perfmodel", "serve", "--host", "0.0.0.0", "--port", "8000"]
