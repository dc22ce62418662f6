"""Tensor parallelism as a layer around the engine (gloo on CPU, NCCL on CUDA).

``rendezvous.py``  joining and leaving the process group
``supervisor.py``  rank 0's view of the rank processes it spawned: liveness, failure, shutdown
``sync.py``        the per-step batch broadcast (tensors only), the cross-rank KV check
``worker.py``      the loop ranks 1..N-1 run
``runner.py``      ``TensorParallelRunner``: what the scheduler drives on rank 0; ``run_node``

Every rank holds the same plain ``Engine`` over its shard; rank 0 runs the scheduler, and each
step its batch is broadcast so that all ranks run the same forward pass; only rank 0 samples.
Importing this package does not import torch.distributed.
"""
