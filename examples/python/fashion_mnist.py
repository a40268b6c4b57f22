"""Fashion-MNIST as in-memory tensors (Debian's dataset-fashion-mnist), shared by the examples."""
import gzip
import os
import struct

import torch

DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(f">{dims}I", data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).view(*shape)


def load(split="train"):
    """(images as float32 N x 784 in [0, 1], labels as int64 N)."""
    prefix = "train" if split == "train" else "t10k"
    images = _idx(os.path.join(DIR, f"{prefix}-images-idx3-ubyte.gz"))
    labels = _idx(os.path.join(DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    return images.view(images.shape[0], -1).float() / 255.0, labels.long()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))
