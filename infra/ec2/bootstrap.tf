# What every node runs at first boot: cloud-init installs the pinned host key, then user_data.sh.tftpl
# (the TTL timer, apt behind unattended-upgrades, the GPU driver of cluster_type, the runtime -- Docker and
# the image, or without an image torch + Open MPI + mpi4py in a virtualenv --, the GPU smoke test, and last
# the ready marker that `make up` waits for).

locals {
  # The host runtime (no image): the torch build of each kind, the same release the images pin
  # (docker/*/Dockerfile TORCH_VERSION=2.13.0), for Ubuntu 24.04's Python 3.12. Checked 2026-11-24:
  # - g4dn: PyPI's torch 2.13.0 is PyTorch's CUDA 13.0 build (torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl
  #   listed on https://pypi.org/simple/torch/); CUDA 13 needs driver >= 580, which the Deep Learning Base OSS
  #   Nvidia Driver AMI ships. CUDA runtime, cuDNN and NCCL come as nvidia-* wheels.
  # - cpu: torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl on https://download.pytorch.org/whl/cpu
  #   (seen in public Dockerfiles and lock files; that host is not reachable from this project's machine).
  # - g4ad: torch-2.13.0+rocm7.2-cp312-cp312-manylinux_2_28_x86_64.whl on https://download.pytorch.org/whl/rocm7.2
  #   (PyTorch 2.13's ROCm build is 7.2, pytorch/pytorch PR 187075; ~6.2 GB; not on PyPI). It carries its own
  #   ROCm user space but no gfx1011 (V520) kernels: the smoke test below fails such a node (docs/aws.md).
  host_torch = {
    cpu  = { index = "https://download.pytorch.org/whl/cpu", requirement = "torch==2.13.0+cpu" }
    g4dn = { index = "https://pypi.org/simple", requirement = "torch==2.13.0" }
    g4ad = { index = "https://download.pytorch.org/whl/rocm7.2", requirement = "torch==2.13.0+rocm7.2" }
  }[var.cluster_type]

  # How a container of the image gets the node's GPUs: the same flags as the docker runtime of `make
  # train` (scripts/multinode/plan/runtime.py).
  container_gpu_args = {
    cpu  = ""
    g4dn = "--gpus all"
    g4ad = "--device /dev/kfd --device /dev/dri --group-add video --security-opt seccomp=unconfined"
  }[var.cluster_type]

  bootstrap_vars = {
    cluster_type         = var.cluster_type
    image                = var.image == null ? "" : var.image
    ssh_user             = local.ssh_user
    amdgpu_installer_url = var.amdgpu_installer_url == null ? "" : var.amdgpu_installer_url
    torch_index          = local.host_torch.index
    torch_requirement    = local.host_torch.requirement
    host_requirements    = join(" ", var.host_requirements)
    gpu_smoke_script     = var.gpu_smoke_script
    container_gpu_args   = local.container_gpu_args
  }
  # One script per node: each carries its own expiry (compute.tf node_expires_at).
  bootstrap_script = [for expires in local.node_expires_at : templatefile("${path.module}/user_data.sh.tftpl", merge(local.bootstrap_vars, {
    expires_at      = expires
    expiry_calendar = "${formatdate("YYYY-MM-DD hh:mm:ss", expires)} UTC" # systemd OnCalendar= form
  }))]
}
