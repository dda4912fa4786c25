# A multinode cluster on EC2: raw aws_* resources only (no registry modules), tagged so that
# `make down` and `make reap` can find every instance again.

provider "aws" {
  region = var.region
  # The provider retries a call up to max_retries times, backing off exponentially (default 25: hashicorp/
  # terraform-provider-aws website/docs/index.html.markdown), and it counts RunInstances' InsufficientInstanceCapacity
  # as retryable: minutes before a refusal surfaces. Bounded, so a replacement's refusal reaches the recovery
  # within RECOVER_WAIT (scripts/multinode/providers/aws/replace.py).
  max_retries = var.max_retries

  # General -> specific: user tags first, then ours (which must not be overridden).
  default_tags {
    tags = local.tags
  }
}

locals {
  tags = merge(var.tags, {
    cluster    = var.cluster_name
    cluster-id = var.cluster_id
    owner      = var.owner
    expiry     = var.expires_at
    managed-by = "multinode"
  })

  default_instance_type = {
    cpu  = "c6i.xlarge"
    g4dn = "g4dn.xlarge"
    g4ad = "g4ad.xlarge"
  }
  instance_type = coalesce(var.instance_type, local.default_instance_type[var.cluster_type])

  # GPUs per instance type; sizes not listed have one.
  gpu_count = {
    "g4dn.12xlarge" = 4
    "g4dn.metal"    = 8
    "g4ad.8xlarge"  = 2
    "g4ad.16xlarge" = 4
  }
  accelerator       = { cpu = "none", g4dn = "nvidia", g4ad = "amd" }[var.cluster_type]
  accelerator_count = var.cluster_type == "cpu" ? 0 : lookup(local.gpu_count, local.instance_type, 1)

  # SSM public parameters: always the current image, no hard-coded AMI ids per region.
  ami_parameter = {
    # Ubuntu 24.04 everywhere: the OS AWS documents the AMD driver on for g4ad, and the one the Deep
    # Learning Base OSS Nvidia Driver AMI (driver >= 580, which CUDA 13 needs) is built on for g4dn.
    cpu  = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
    g4dn = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
    g4ad = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
  }[var.cluster_type]
  ami_id = coalesce(var.ami_id, one(data.aws_ssm_parameter.ami[*].insecure_value))

  ssh_user = "ubuntu" # both the Ubuntu and the Deep Learning AMI use it

  # Account-wide names (key pair, placement group, IAM role and profile, ECR repository) carry the
  # cluster id: two clusters of the same name in one account never collide.
  unique_name = "multinode-${var.cluster_name}-${var.cluster_id}"
}

# Read only when no ami_id is given, so an override needs no ssm:GetParameter permission.
data "aws_ssm_parameter" "ami" {
  count = var.ami_id == null ? 1 : 0

  name = local.ami_parameter
}
