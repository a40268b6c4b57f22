"""Tensors as hetra._core's raw buffers (address, element count, dtype name)."""
import torch

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
}


def dtype_name(tensor):
    """hetra's name for the tensor's element type; TypeError naming the allowed ones."""
    try:
        return _DTYPES[tensor.dtype]
    except KeyError:
        allowed = ", ".join(str(d) for d in _DTYPES)
        raise TypeError(f"hetra cannot move {tensor.dtype} tensors; allowed: {allowed}") from None


def check_buffer(tensor, what="tensor"):
    """hetra reads and writes the tensor's memory in place: it must be a dense CPU tensor."""
    if tensor.device.type != "cpu":
        raise ValueError(f"{what} is on {tensor.device}; hetra.torch moves CPU tensors only")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} is not contiguous; pass tensor.contiguous()")
    dtype_name(tensor)
    return tensor
