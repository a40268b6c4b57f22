"""Importing hetra.torch registers the `hetra` backend of torch.distributed exactly once."""
import importlib

import torch.distributed as dist


def test_importing_twice_registers_once():
    import hetra.torch
    import hetra.torch.backend as backend

    assert "HETRA" in dist.Backend._plugins
    creator = dist.Backend._plugins["HETRA"]
    importlib.reload(backend)  # the module runs again: it must find the backend registered
    assert backend.register() is False
    assert dist.Backend._plugins["HETRA"] is creator
    assert [name for name in dist.Backend._plugins if name == "HETRA"] == ["HETRA"]
    assert hetra.torch.backend is backend
