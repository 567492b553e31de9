# Two images from one file:
#   panel       the web server, the default and long workers and beat (no torch, no engine)
#   gpu-worker  the panel's code plus an engine venv with CUDA vLLM and AutoAWQ, for GPU hosts
FROM python:3.11-slim AS panel
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 TOKENWISE_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml ./
RUN pip install --no-cache-dir . && rm -rf build *.egg-info
COPY . .
RUN useradd --create-home --uid 1000 tokenwise && mkdir -p /data && chown tokenwise /data
USER tokenwise
EXPOSE 8000
CMD ["python", "-m", "uvicorn", "panel.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--loop", "uvloop", "--http", "httptools", "--no-access-log"]

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS gpu-worker
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 TOKENWISE_DATA_DIR=/data ENGINE_PYTHON=/opt/engine/bin/python
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
# The engine venv: CUDA vLLM, and AutoAWQ without its pins (they would replace vLLM's torch and transformers).
RUN python3 -m venv /opt/engine \
    && /opt/engine/bin/pip install --no-cache-dir vllm==0.32.0 \
    && /opt/engine/bin/pip install --no-cache-dir --no-deps autoawq==0.2.9 \
    && /opt/engine/bin/pip install --no-cache-dir accelerate zstandard datasets
# The panel's own venv (no torch).
RUN python3 -m venv /opt/panel
ENV PATH=/opt/panel/bin:$PATH
WORKDIR /app
COPY pyproject.toml ./
RUN pip install --no-cache-dir . && rm -rf build *.egg-info
COPY . .
RUN useradd --create-home --uid 1001 tokenwise && mkdir -p /data && chown tokenwise /data
USER tokenwise
CMD ["python", "-m", "workers.start", "gpu"]
