# The nodes: one instance per node, same AMI, same bootstrap, pinned host keys.

resource "aws_key_pair" "client" {
  key_name   = local.unique_name
  public_key = var.ssh_public_key
}

resource "aws_placement_group" "cluster" {
  count = var.placement_group ? 1 : 0

  name     = local.unique_name
  strategy = "cluster"
}

locals {
  # Each node's group: none for a node EC2 had no capacity for inside it (outside_placement_group; AWS's placement
  # group guide: a later launch into a cluster group is more likely to get an insufficient capacity error), nor for
  # a node in another zone (a cluster placement group lives in one zone).
  node_placement_group = [for i in range(var.nodes) : var.placement_group && !contains(var.outside_placement_group, i) && local.node_zone[i] == local.zone ? aws_placement_group.cluster[0].id : null]

  # Each node's expiry: the cluster's, or its own when it is a replacement (node_expires_at: TTL_HOURS from its launch).
  node_expires_at = [for i in range(var.nodes) : lookup(var.node_expires_at, tostring(i), var.expires_at)]
}

resource "aws_instance" "node" {
  count = var.nodes

  ami                    = local.ami_id
  instance_type          = local.instance_type
  subnet_id              = local.node_subnet[count.index]
  vpc_security_group_ids = [aws_security_group.cluster.id]
  key_name               = aws_key_pair.client.key_name
  iam_instance_profile   = aws_iam_instance_profile.node.name # ECR read-only: pulls the image (registry.tf)
  placement_group        = local.node_placement_group[count.index]
  ebs_optimized          = true
  monitoring             = false

  # Reached over SSH from ssh_cidr (security.tf); there is no bastion for a throw-away cluster.
  associate_public_ip_address = true

  # The TTL timer in user data runs `shutdown -h`; "terminate" turns that into the end of the
  # instance (and of its billing), not a stopped instance whose EBS volume keeps costing.
  instance_initiated_shutdown_behavior = "terminate"

  dynamic "instance_market_options" {
    for_each = var.spot ? [1] : []
    content {
      market_type = "spot"
      spot_options {
        spot_instance_type             = "one-time"
        instance_interruption_behavior = "terminate"
      }
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only
    http_put_response_hop_limit = 2          # containers on the node (docker bridge) may still read it
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.root_volume_gb
    encrypted             = true
    delete_on_termination = true
  }

  # cloud-init installs the host key before sshd starts (no window with a generated key),
  # then runs the bootstrap script once.
  user_data_replace_on_change = true
  user_data = join("\n", ["#cloud-config", yamlencode({
    ssh_deletekeys  = true
    ssh_genkeytypes = []
    ssh_keys = {
      ed25519_private = var.host_keys[count.index].private_key
      ed25519_public  = var.host_keys[count.index].public_key
    }
    hostname = "${var.cluster_name}-node-${count.index}"
    write_files = [{
      path        = "/var/lib/multinode/bootstrap.sh"
      permissions = "0700"
      content     = local.bootstrap_script[count.index]
    }]
    runcmd = [["/var/lib/multinode/bootstrap.sh"]]
  })])

  # A replacement's own expiry overrides the default tags' (resource tags win over default_tags on the same key:
  # the AWS provider's default_tags documentation); the other nodes carry no resource-level expiry.
  tags = merge({
    Name = "${var.cluster_name}-node-${count.index}"
    node = "node-${count.index}"
  }, contains(keys(var.node_expires_at), tostring(count.index)) ? { expiry = local.node_expires_at[count.index] } : {})
  volume_tags = merge(local.tags, { Name = "${var.cluster_name}-node-${count.index}", expiry = local.node_expires_at[count.index] })

  lifecycle {
    precondition {
      condition     = local.node_subnet[count.index] != null
      error_message = "node_zones moves a node to a zone the cluster has no subnet in (zones: the ones that offer the instance type; none besides its own with an existing subnet_id)."
    }
  }

  #checkov:skip=CKV_AWS_88:The control machine SSHes to the nodes directly; inbound is limited to ssh_cidr.
  #checkov:skip=CKV_AWS_126:Detailed monitoring costs per instance and a cluster lives hours; status checks do not need it.
}
