"""hetra for Python: data-parallel training on heterogeneous devices.

`hetra._core` is the C++ runtime (communicator, store, rank discovery, sampler, balancer, slow-device
emulation) on raw buffers; `hetra.torch` adapts PyTorch to it.
"""
import pkgutil

# A development build keeps the compiled module in the build tree (build/python/hetra/_core*.so)
# while the Python sources stay in python/hetra: both directories on sys.path form one package.
__path__ = pkgutil.extend_path(__path__, __name__)

__version__ = "0.1.0"
