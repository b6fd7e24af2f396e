# GPU replicas: SGLang's official image with the bundle installed into it.
#   docker build -f deploy/container/gpu.Dockerfile -t REGISTRY/sglang-dspark/gpu:0.1.0-sglang0.5.23 .
# Model, drafter and SLA profile are mounted at run time (deploy/k8s/), not baked: the launcher's
# fingerprint check decides at start whether the profile fits them.
FROM lmsysorg/sglang:v0.5.23-cu130

ENV PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1 HF_HUB_OFFLINE=1
COPY . /opt/sglang-dspark
WORKDIR /opt/sglang-dspark

# The image's torch, CUDA libraries, SGLang and kernels stay exactly as they are: the bundle is
# resolved against them, and a pin of ours that disagrees fails the build instead of replacing them.
RUN pip list --format=freeze | grep -iE '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+|sglang|sgl-kernel|flashinfer[a-z0-9-]*)==' > /tmp/image-constraints.txt && pip install --constraint /tmp/image-constraints.txt ".[router]"

# SGLang must load the plugin in this image: a build whose plugin would stand down fails here.
RUN python -m sglang_dspark.sglang_plugin

EXPOSE 30000
ENTRYPOINT ["python", "-m", "sglang_dspark.launch"]
CMD ["--help"]
