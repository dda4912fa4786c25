"""The GPU code paths checked on a real GPU (issue 49), in one command that runs on any CUDA machine:

    python -m bench.gpu --out OUT            (every check on cuda:0; writes OUT/gpu.json and OUT/gpu.log)
    python -m bench.gpu.page OUT/gpu.json    (docs/gpu.md from that JSON, and docs/gpu.json beside it)

``--device cpu`` runs the same code on the CPU (gloo instead of NCCL, CPU tensors, and an injected collective
error where only CUDA can make one time out): a rehearsal whose figures say nothing about a GPU.

* :mod:`bench.gpu.plan`: the train.py runs of every item (pure);
* :mod:`bench.gpu.runs`: their executor, and the weights compared between runs;
* :mod:`bench.gpu.smoke`: the pre-flight GPU smoke test (``gpucheck``) and ``NPROC=auto`` on this machine;
* :mod:`bench.gpu.regroup`: NCCL at world size 1: a group made, used, aborted, and a new one in the same process;
* :mod:`bench.gpu.timeout`: the trainer's NCCL error handling when a collective times out, and the survivors' resume;
* :mod:`bench.gpu.machine`: what the figures were measured on;
* :mod:`bench.gpu.verdicts`: each item's verdict from the JSON; :mod:`bench.gpu.page`: the page.
"""
