# CPU replicas of the reference engine, and the router (the `router` extra).
#   docker build -f deploy/container/cpu.Dockerfile -t REGISTRY/sglang-dspark/cpu:0.1.0 .
# Model, drafter and SLA profile are mounted at run time (deploy/k8s/), not baked.
FROM python:3.11.14-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1
COPY . /opt/sglang-dspark
WORKDIR /opt/sglang-dspark

# torch's CPU build first: PyPI's Linux wheel of the same version pulls in the CUDA libraries.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.14.1+cpu"

# The bundle against that torch (its pin torch==2.14.1 accepts the +cpu build; nothing replaces it).
RUN pip list --format=freeze | grep -iE '^torch==' > /tmp/image-constraints.txt && pip install --constraint /tmp/image-constraints.txt ".[router,loadtest]"

# The launcher and the router start in this image.
RUN python -m sglang_dspark.launch --help > /dev/null && python -m sglang_router.launch_router --help > /dev/null

EXPOSE 30000
ENTRYPOINT ["python", "-m", "sglang_dspark.launch"]
CMD ["--help"]
