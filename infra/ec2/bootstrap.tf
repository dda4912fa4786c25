# What every node runs at first boot: cloud-init installs the pinned host key, then user_data.sh.tftpl
# (Docker, ECR credential helper, the GPU driver of cluster_type, the image, the GPU check, the TTL
# timer, and last the ready marker that `make up` waits for).

locals {
  # The ROCm release of the g4ad kernel driver: docker/rocm's ROCM_VERSION, since the amdgpu driver
  # of a release is the one AMD supports that release's user space (in the image) with.
  rocm_release = "7.2.1"

  bootstrap_vars = {
    cluster_type         = var.cluster_type
    image                = var.image
    ssh_user             = local.ssh_user
    expires_at           = var.expires_at
    expiry_calendar      = "${formatdate("YYYY-MM-DD hh:mm:ss", var.expires_at)} UTC" # systemd OnCalendar= form
    rocm_release         = local.rocm_release
    amdgpu_installer_url = var.amdgpu_installer_url
  }
  bootstrap_script = templatefile("${path.module}/user_data.sh.tftpl", local.bootstrap_vars)
}
