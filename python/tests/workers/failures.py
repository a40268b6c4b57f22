"""One rank of the failure tests.

    failures.py killed     rank 2 dies (SIGKILL) after a first allreduce; the others' next
                           allreduce must raise PeerAbortedError naming rank 2
    failures.py mismatch   ranks allreduce different element counts: a clear typed error
Prints "RAISED <type>: <message>" for the error it got.
"""
import os
import signal
import sys

import torch

import hetra.torch as ht

what = sys.argv[1]
ht.init(timeout=30)
rank = ht.rank()
t = torch.ones(1000)
ht.allreduce(t).wait()
try:
    if what == "killed":
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        ht.allreduce(torch.ones(1000)).wait()
    elif what == "mismatch":
        ht.allreduce(torch.ones(1000 + rank)).wait()
    else:
        sys.exit(f"unknown case {what!r}")
except ht.Error as e:
    rank_attr = getattr(e, "rank", None)
    print(f"RAISED {type(e).__name__} rank={rank_attr}: {e}")
    sys.exit(0)
sys.exit("no error raised")
