"""The same script under torchrun and under hetra launch: hetra.torch finds its rank, and an
unchanged torch.distributed init (env://) on backend="hetra" works too. Prints one line:
    launcher=L rank=R size=N local=K hetra_sum=S dist_sum=S"""
import torch
import torch.distributed as dist

import hetra.torch as ht

world = ht.init(timeout=60)
t = torch.tensor([float(ht.rank() + 1)])
ht.allreduce(t).wait()
dist.init_process_group("hetra")
u = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(u)
dist.destroy_process_group()
print(f"launcher={world.context.launcher} rank={ht.rank()} size={ht.size()} "
      f"local={ht.local_rank()} hetra_sum={t.item():g} dist_sum={u.item():g}", flush=True)
