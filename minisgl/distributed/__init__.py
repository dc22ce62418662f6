"""Tensor parallelism over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

``group.py``       process groups, rendezvous and the collectives the model layers call
``sharding.py``    which heads / columns / vocabulary rows a rank holds
``supervisor.py``  rank 0's view of the rank processes it spawned: liveness, failure, shutdown
``sync.py``        the per-step batch broadcast (tensors only), the cross-rank KV check
``worker.py``      the loop ranks 1..N-1 run, and the entry point of a non-zero node

Rank 0 runs the scheduler; every step its batch is broadcast so that all ranks run the same
forward pass, and only rank 0 samples. Importing this package does not import torch.distributed.
"""
