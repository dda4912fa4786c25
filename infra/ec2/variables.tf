# Inputs of the cluster. multinode's AWS provider writes them to terraform.tfvars.json;
# examples/*.tfvars show them for a manual `terraform apply`.

variable "cluster_name" {
  type        = string
  description = "Cluster name: prefix of every resource name and the value of the 'cluster' tag."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,15}$", var.cluster_name))
    error_message = "cluster_name must be 1-16 lowercase letters, digits or '-', starting with a letter (e.g. \"dev\")."
  }
}

variable "cluster_id" {
  type        = string
  description = "Random id of this cluster (6 hex digits, made by 'make up'): suffix of every account-wide name (key pair, placement group, IAM role, ECR repository) and the value of the 'cluster-id' tag, so two clusters of the same name never collide."

  validation {
    condition     = can(regex("^[0-9a-f]{6}$", var.cluster_id))
    error_message = "cluster_id must be 6 lowercase hex digits, e.g. \"1a2b3c\" (python3 -c 'import secrets; print(secrets.token_hex(3))')."
  }
}

variable "region" {
  type        = string
  description = "AWS region to create the cluster in, e.g. us-east-1."

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must look like us-east-1 or eu-west-2."
  }
}

variable "cluster_type" {
  type        = string
  description = "Kind of node: cpu (no accelerator), g4dn (NVIDIA T4) or g4ad (AMD Radeon Pro V520)."

  validation {
    condition     = contains(["cpu", "g4dn", "g4ad"], var.cluster_type)
    error_message = "cluster_type must be one of cpu, g4dn, g4ad."
  }
}

variable "instance_type" {
  type        = string
  description = "EC2 instance type; null picks the default of cluster_type (c6i.xlarge, g4dn.xlarge, g4ad.xlarge)."
  default     = null

  validation {
    condition = var.instance_type == null || (
      var.cluster_type == "cpu" ? !can(regex("^(g|p|inf|trn|dl|f)[0-9]", var.instance_type)) :
      startswith(coalesce(var.instance_type, "-"), "${var.cluster_type}.")
    )
    error_message = "instance_type must belong to cluster_type: g4dn.* for g4dn, g4ad.* for g4ad, a non-accelerated type (e.g. c6i.xlarge) for cpu."
  }
}

variable "nodes" {
  type        = number
  description = "Number of instances (node-0 is the head)."

  validation {
    condition     = var.nodes >= 1 && var.nodes <= 64 && floor(var.nodes) == var.nodes
    error_message = "nodes must be a whole number from 1 to 64."
  }
}

variable "ssh_cidr" {
  type        = string
  description = "The only source allowed to SSH in: your public address as a /32, e.g. 203.0.113.4/32 (no default on purpose)."

  validation {
    condition     = can(cidrhost(var.ssh_cidr, 0)) && !contains(["0.0.0.0/0", "::/0"], var.ssh_cidr)
    error_message = "ssh_cidr must be a CIDR such as 203.0.113.4/32 and not 0.0.0.0/0; find your address with 'curl -s https://checkip.amazonaws.com'."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "Client public key (OpenSSH format) installed for the ssh user of every node."

  validation {
    condition     = can(regex("^ssh-(ed25519|rsa) [A-Za-z0-9+/=]+", var.ssh_public_key))
    error_message = "ssh_public_key must be an OpenSSH public key line (ssh-ed25519 AAAA...)."
  }
}

variable "host_keys" {
  type = list(object({
    private_key = string
    public_key  = string
  }))
  description = "One ed25519 SSH host key pair per node, made on the control machine so the client pins them without trust-on-first-use. Passed through user data, which is readable by anyone on the instance via IMDS (see README)."
  sensitive   = true

  validation {
    condition     = alltrue([for k in var.host_keys : startswith(k.public_key, "ssh-ed25519 ") && strcontains(k.private_key, "OPENSSH PRIVATE KEY")])
    error_message = "host_keys must be ed25519 key pairs in OpenSSH format (ssh-keygen -t ed25519)."
  }

  validation {
    condition     = length(var.host_keys) == var.nodes
    error_message = "host_keys needs exactly one key pair per node (as many as nodes)."
  }
}

variable "owner" {
  type        = string
  description = "Who to ask about this cluster; the value of the 'owner' tag."

  validation {
    condition     = length(trimspace(var.owner)) > 0
    error_message = "owner must not be empty; use your user name or e-mail address."
  }
}

variable "ttl_hours" {
  type        = number
  description = "Hours after boot at which every node shuts down and, being instance_initiated_shutdown_behavior=terminate, ends itself."
  default     = 8

  validation {
    condition     = var.ttl_hours >= 1 && var.ttl_hours <= 72 && floor(var.ttl_hours) == var.ttl_hours
    error_message = "ttl_hours must be a whole number from 1 to 72; run 'make up' again for a longer job."
  }
}

variable "expires_at" {
  type        = string
  description = "RFC 3339 time at which the cluster ends itself (now + ttl_hours); the value of the 'expiry' tag. Passed in so plans stay stable."

  validation {
    condition     = can(formatdate("YYYY", var.expires_at))
    error_message = "expires_at must be an RFC 3339 timestamp such as 2026-11-22T18:00:00Z."
  }
}

variable "spot" {
  type        = bool
  description = "Run on one-time spot instances (cheaper, can be interrupted) instead of on-demand."
  default     = false
}

variable "image" {
  type        = string
  description = "Container image every node pulls at boot and runs jobs in; null runs jobs in the host runtime instead (a virtualenv with torch for cluster_type, Open MPI and mpi4py, made by the bootstrap)."
  default     = null

  validation {
    condition     = var.image == null || can(regex("^[a-z0-9.-]+(:[0-9]+)?/[^ ]+$", coalesce(var.image, "-")))
    error_message = "image must be a reference with a registry host the nodes can pull from (e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-cuda:latest), or null for the host runtime."
  }
}

variable "host_requirements" {
  type        = list(string)
  description = "Pinned Python packages the host runtime (image = null) installs next to torch; make up passes docker/requirements.txt, the images' own list."
  default     = ["numpy==2.4.6", "mpi4py==4.1.2", "scikit-learn==1.9.1", "PyYAML==6.0.3", "tqdm==4.70.1", "boto3==1.44.5"]

  validation {
    condition     = alltrue([for r in var.host_requirements : can(regex("^[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+!-]*$", r))])
    error_message = "host_requirements must be pinned requirements such as numpy==2.4.6 (name==version, nothing else)."
  }
}

variable "gpu_smoke_script" {
  type        = string
  description = "Python source of multinode's GPU smoke test (multinode.checks.gpu.SMOKE_SCRIPT), run by the bootstrap of GPU nodes in the job runtime; make up passes it. Empty skips the test (a manual apply)."
  default     = ""
}

variable "ami_id" {
  type        = string
  description = "AMI override; null uses the SSM public parameter of cluster_type (Deep Learning Base OSS Nvidia Driver AMI, Ubuntu 24.04, for g4dn; Ubuntu 24.04 otherwise)."
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]{8,17}$", coalesce(var.ami_id, "-")))
    error_message = "ami_id must look like ami-0123456789abcdef0, or be null."
  }
}

variable "root_volume_gb" {
  type        = number
  description = "Size of each node's encrypted gp3 root volume in GiB (the Deep Learning AMI needs at least 75)."
  default     = 100

  validation {
    condition     = var.root_volume_gb >= 30 && var.root_volume_gb <= 2000
    error_message = "root_volume_gb must be from 30 to 2000."
  }
}

variable "vpc_id" {
  type        = string
  description = "Existing VPC to use; null creates a VPC for the cluster. Give subnet_id with it."
  default     = null
}

variable "subnet_id" {
  type        = string
  description = "Existing subnet (in vpc_id) for the nodes; null creates one. It must give instances a route to the internet."
  default     = null

  validation {
    condition     = (var.subnet_id == null) == (var.vpc_id == null)
    error_message = "vpc_id and subnet_id go together: set both to use an existing network, or neither to create one."
  }
}

variable "vpc_cidr" {
  type        = string
  description = "CIDR of the VPC created when vpc_id is null."
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0))
    error_message = "vpc_cidr must be a CIDR such as 10.42.0.0/16."
  }
}

variable "availability_zone" {
  type        = string
  description = "The cluster's availability zone (its subnet, its placement group); null takes the first zone (by name) of `zones`."
  default     = null

  validation {
    condition     = var.availability_zone == null || can(regex("^[a-z]{2}(-[a-z]+)+-[0-9][a-z]$", coalesce(var.availability_zone, "-")))
    error_message = "availability_zone must be a zone name such as us-east-1b, or null to pick one that offers the instance type."
  }
}

variable "zones" {
  type        = list(string)
  description = "The zones of the region that offer the instance type: the cluster gets a subnet in each (node_zones moves a node there). null reads them (aws_ec2_instance_type_offerings); make up writes them, so later plans never see the list change."
  default     = null

  validation {
    condition     = var.zones == null || alltrue([for z in coalesce(var.zones, []) : can(regex("^[a-z]{2}(-[a-z]+)+-[0-9][a-z]$", z))])
    error_message = "zones must be zone names such as us-east-1b, or null to read the zones that offer the instance type."
  }
}

variable "node_zones" {
  type        = map(string)
  description = "Node index -> zone, for a node launched outside the cluster's zone: 'make up' and a replacement add a node here when EC2 has no capacity for it in its zone, and launch it again. The zone must be one of `zones`."
  default     = {}

  validation {
    condition     = alltrue([for i, z in var.node_zones : can(regex("^[0-9]+$", i)) && can(regex("^[a-z]{2}(-[a-z]+)+-[0-9][a-z]$", z))])
    error_message = "node_zones must map node indexes (\"1\") to zone names (\"us-east-1b\")."
  }
}

variable "node_expires_at" {
  type        = map(string)
  description = "Node index -> RFC 3339 expiry, for a replacement: its own TTL from its launch (a replacement near the cluster's expiry would otherwise end soon after it is ready). Other nodes keep expires_at."
  default     = {}

  validation {
    condition     = alltrue([for i, t in var.node_expires_at : can(regex("^[0-9]+$", i)) && can(formatdate("YYYY", t))])
    error_message = "node_expires_at must map node indexes (\"1\") to RFC 3339 timestamps such as 2026-11-22T18:00:00Z."
  }
}

variable "ecr_repository" {
  type        = string
  description = "Name of an existing ECR repository (in region) the nodes pull from; null creates one for the cluster (multinode-<cluster_name>-<cluster_id>). Every node may pull from any repository of the account (AmazonEC2ContainerRegistryReadOnly)."
  default     = null

  validation {
    condition     = var.ecr_repository == null || can(regex("^[a-z0-9]+([._/-][a-z0-9]+)*$", coalesce(var.ecr_repository, "-")))
    error_message = "ecr_repository must be an ECR repository name such as multinode-cuda (lowercase letters, digits, . _ - /), or null to create one."
  }
}

variable "bucket_names" {
  type        = list(string)
  description = "S3 buckets the nodes' role may list, read, write and delete objects in (DATA is read from one, CHECKPOINT_URL written to and pruned in one); empty: no S3 access."
  default     = []

  validation {
    condition     = alltrue([for b in var.bucket_names : can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", b))])
    error_message = "bucket_names must be S3 bucket names (3-63 lower-case letters, digits, dots and hyphens), not URLs."
  }
}

variable "placement_group" {
  type        = bool
  description = "Put the nodes in a 'cluster' placement group (low latency, high bandwidth between nodes)."
  default     = true
}

variable "outside_placement_group" {
  type        = list(number)
  description = "Indexes of nodes launched outside the placement group: 'make up' and a replacement add a node here when EC2 refused it capacity inside the group (InsufficientInstanceCapacity), and launch it again."
  default     = []

  validation {
    condition     = alltrue([for i in var.outside_placement_group : i >= 0 && floor(i) == i])
    error_message = "outside_placement_group must list node indexes (0, 1, ...)."
  }
}

variable "max_retries" {
  type        = number
  description = "How often the AWS provider retries a failed API call (its default is 25, with exponential back-off: minutes before EC2's capacity refusal surfaces)."
  default     = 3

  validation {
    condition     = var.max_retries >= 1 && var.max_retries <= 25 && floor(var.max_retries) == var.max_retries
    error_message = "max_retries must be a whole number from 1 to 25."
  }
}

variable "amdgpu_installer_url" {
  type        = string
  description = "g4ad: AMD's amdgpu-install package for Ubuntu 24.04 (noble); when set the bootstrap also installs AMD's DKMS driver (amdgpu-install --usecase=dkms). null keeps the Ubuntu kernel's own amdgpu, from linux-modules-extra-aws (our default; AWS's page, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/install-amd-driver.html, goes on to amdgpu-install): amdgpu-dkms 30.30.x is reported failing to build on 7.0 kernels (ROCm/legacy-rocm-build issue 6193)."
  default     = null

  validation {
    # Any release directory: AMD's installer names are amdgpu-install_<major.minor>.<build>-<n>_all.deb,
    # e.g. https://repo.radeon.com/amdgpu-install/7.2.1/ubuntu/noble/amdgpu-install_7.2.1.70201-1_all.deb.
    condition     = var.amdgpu_installer_url == null || can(regex("^https://repo\\.radeon\\.com/amdgpu-install/[0-9][0-9.]*/ubuntu/noble/amdgpu-install_[0-9][0-9.]*-[0-9]+_all\\.deb$", coalesce(var.amdgpu_installer_url, "-")))
    error_message = "amdgpu_installer_url must be AMD's amdgpu-install .deb for Ubuntu noble (https://repo.radeon.com/amdgpu-install/<release>/ubuntu/noble/amdgpu-install_<version>-<n>_all.deb), or null for the kernel's own amdgpu driver."
  }
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource; merged under the cluster, owner, expiry and managed-by tags."
  default     = {}
}
