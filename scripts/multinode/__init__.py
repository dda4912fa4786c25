"""multinode: run a PyTorch data-parallel job on every node of a cluster (local or EC2).

Data flows one way: config -> provider -> inventory -> the run (plan, pre-flight, prepare, launch, watch,
diagnose, summarize) over a backend (ssh, slurm) and a runtime (host, container) -> logs and summary.
The package's layers and where to add things: docs/architecture.md.
"""

__version__ = "0.1.0"
