# Who may talk to the nodes: SSH from ssh_cidr only, anything between members of the cluster
# (rendezvous, gloo/NCCL/RCCL, MPI use random high ports), nothing else inbound.

resource "aws_security_group" "cluster" {
  name        = local.unique_name
  description = "multinode cluster ${var.cluster_name}: SSH from ssh_cidr, all traffic within the cluster"
  vpc_id      = local.vpc_id

  tags = { Name = local.unique_name }
}

resource "aws_vpc_security_group_ingress_rule" "ssh" {
  security_group_id = aws_security_group.cluster.id
  description       = "SSH from the operator's address only"
  cidr_ipv4         = var.ssh_cidr
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
}

resource "aws_vpc_security_group_ingress_rule" "cluster" {
  security_group_id            = aws_security_group.cluster.id
  description                  = "All traffic between cluster members (torchrun rendezvous, NCCL/gloo, MPI)"
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "-1"
}

resource "aws_vpc_security_group_egress_rule" "all" {
  security_group_id = aws_security_group.cluster.id
  description       = "Outbound to anywhere: apt, Docker/NVIDIA/AMD package repositories and container image pulls"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"

  #checkov:skip=CKV_AWS_382:Nodes install packages and pull images from registries whose addresses are not fixed; inbound stays closed.
}
