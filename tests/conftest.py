import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Test models are tiny: one intra-op thread is faster than two, and never stalls in OpenMP
# barriers when the other core is busy (CI machines are shared).
torch.set_num_threads(1)
