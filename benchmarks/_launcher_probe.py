"""What every launch pays anyway: interpreter, ``import torch``, joining the process group. Prints when done."""

import time

import torch.distributed as dist

dist.init_process_group(backend="gloo")
if dist.get_rank() == 0:
    print(f"READY {time.time():.6f}", flush=True)
dist.barrier()
dist.destroy_process_group()
