"""The engines a user would otherwise pick, run as online servers next to minisgl's.

``python -m benchmarks.peers setup`` installs them once into a cache folder (see ``paths``);
``python -m benchmarks.peers status`` runs each one's check (a short generation where it can) and
says which are ready. A benchmark run lists a peer that is not installed under "Not run" with the
setup command, and runs the others.
"""

PEERS = ("llama-server", "vllm")
