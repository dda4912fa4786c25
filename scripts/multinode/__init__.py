"""multinode: run a PyTorch data-parallel job on every node of a cluster (local or EC2).

Data flows one way: config -> provider -> inventory -> launch plan -> runtime -> remote runner.
"""

__version__ = "0.1.0"
