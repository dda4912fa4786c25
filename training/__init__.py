"""The data-parallel trainer that runs under torchrun, mpirun, srun or as one process (entry: train.py)."""
