# bertrain on a CUDA PyTorch image: prepare corpora and pretrain BERT/ALBERT on GPUs.
#   docker build -t bertrain .
#   docker run --gpus all --rm -it --shm-size=8g -v "$PWD/work:/work" bertrain demo
#   docker run --gpus all --rm -it --shm-size=8g -v "$PWD/work:/work" bertrain \
#       launch --nproc 8 pretrain --config albert_base --data data/wiki --run-dir runs/albert
# (`bertrain launch` keeps the processes' exit codes: 75 means requeue; a bare launcher would say 1. --shm-size: loader
# workers send batches through /dev/shm, 64 MiB by default.)
# The base image already has CUDA torch, so the README's CPU torch line is left out here.
FROM pytorch/pytorch:2.8.0-cuda12.9-cudnn9-runtime

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/work/.cache/huggingface \
    WANDB_DIR=/work

WORKDIR /opt/bertrain
# The dependencies from the metadata alone, with an empty package in place of the code: this layer is rebuilt only
# when pyproject.toml changes, not on every source edit. The editable install points at ./bertrain, which the next
# COPY fills. The extras: sentence splitting for Thai, and the Chinese and Japanese word segmenters (the zh/ja
# recipes), as .ci/run installs them.
COPY pyproject.toml README.md ./
RUN mkdir bertrain && touch bertrain/__init__.py \
    && python3 -m pip install --no-cache-dir -e ".[dev,thai,sentencex,zh,ja]"
COPY bertrain ./bertrain
COPY tests ./tests

WORKDIR /work
ENTRYPOINT ["bertrain"]
CMD ["--help"]
