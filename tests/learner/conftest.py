"""Learner tests: tiny tensors, so one intra-op thread (avoids oversubscription on small CI machines)."""

import torch

torch.set_num_threads(1)
