# perfmodel, CPU image by default. Until the HTTP service lands, the container runs the main job of the CLI
# (profile a zoo model and print its profile); pass other perfmodel arguments to run something else:
#   docker build -t perfmodel . && docker run --rm perfmodel zoo list
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# Where torch comes from. The default index serves the CPU wheel; a CUDA image sets BASE_IMAGE to a CUDA runtime
# and TORCH_SPEC/TORCH_INDEX_URL to the matching CUDA build.
ARG TORCH_SPEC="torch==2.13.0+cpu torchvision==0.28.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PERFMODEL_HOME=/data \
    PERFMODEL_MODELS_DIR=/app/models
WORKDIR /app
COPY pyproject.toml README.md ./
COPY perfmodel ./perfmodel
COPY models ./models
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" ${TORCH_SPEC} . \
 && useradd --create-home --uid 1000 perfmodel && mkdir -p /data && chown perfmodel /data
USER perfmodel
VOLUME ["/data"]
ENTRYPOINT ["perfmodel"]
CMD ["profile", "resnet18", "--batch-size", "8"]
