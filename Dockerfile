# bertrain on a CUDA PyTorch image: prepare corpora and pretrain BERT/ALBERT on GPUs.
#   docker build -t bertrain .
#   docker run --gpus all --rm -it -v "$PWD/work:/work" -w /work bertrain demo
#   docker run --gpus all --rm -it -v "$PWD/work:/work" -w /work --entrypoint accelerate bertrain \
#       launch --multi_gpu --num_processes 8 -m bertrain pretrain --config albert_base --data data/wiki
# The base image already has CUDA torch, so the README's CPU torch line is left out here.
FROM pytorch/pytorch:2.8.0-cuda12.9-cudnn9-runtime

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/cache/huggingface \
    WANDB_DIR=/work

WORKDIR /opt/bertrain
# Metadata first so the dependency layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml README.md ./
COPY bertrain ./bertrain
# The README's install command (minus the CPU torch line).
RUN python3 -m pip install --no-cache-dir -e ".[dev]"

COPY tests ./tests

WORKDIR /work
ENTRYPOINT ["bertrain"]
CMD ["--help"]
