# The inventory contract: multinode.providers.aws.terraform.inventory_from_outputs reads exactly this.

output "inventory" {
  description = "The cluster as the orchestrator sees it: head (node-0) first."
  value = {
    cluster    = var.cluster_name
    cluster_id = var.cluster_id
    region     = var.region
    zone       = aws_instance.node[0].availability_zone
    ecr = {
      repository_url = local.ecr_repository_url
      created_by_us  = var.ecr_repository == null
      instance_role  = aws_iam_role.node.name
    }
    subnet_cidr = local.subnet_cidr
    ssh_user    = local.ssh_user
    nodes = [for i, node in aws_instance.node : {
      name              = "node-${i}"
      hostname          = "${var.cluster_name}-node-${i}"
      private_ip        = node.private_ip
      public_ip         = node.public_ip
      instance_id       = node.id
      instance_type     = node.instance_type
      accelerator       = local.accelerator
      accelerator_count = local.accelerator_count
    }]
  }
}
