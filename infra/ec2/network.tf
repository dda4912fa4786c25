# The cluster network: a VPC with a public subnet in the cluster's zone (one AZ, as a cluster placement group
# needs) and one in every other zone that offers the instance type, for a node EC2 has no capacity for in the
# cluster's zone (node_zones); or an existing subnet given by id.

# The zones of the region that offer the instance type (GPU types are not offered in every zone); read only when
# the subnets are created here and `zones` is not given (make up gives it, so later plans never see it change).
data "aws_ec2_instance_type_offerings" "zones" {
  count = var.subnet_id == null && var.zones == null ? 1 : 0

  location_type = "availability-zone"
  filter {
    name   = "instance-type"
    values = [local.instance_type]
  }
}

locals {
  offered_zones = sort(coalesce(var.zones, flatten(data.aws_ec2_instance_type_offerings.zones[*].locations)))
  # The cluster's zone: the first offering zone by name, so the choice is stable between plans.
  zone = coalesce(var.availability_zone, try(local.offered_zones[0], "none"))
  # A subnet in each other offering zone (none with an existing subnet). Its CIDR block is numbered by the zone's
  # place in `zones`, which make up fixes, so a block never moves.
  spare_zones = var.subnet_id == null ? [for z in local.offered_zones : z if z != local.zone] : []
}

resource "aws_vpc" "this" {
  count = var.vpc_id == null ? 1 : 0

  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = { Name = "${var.cluster_name}-vpc" }

  #checkov:skip=CKV2_AWS_11:VPC flow logs need a log group and an IAM role per throw-away cluster; the SG admits only ssh_cidr and the cluster itself.
}

# The VPC's default security group is left with no rules, so nothing can use it by accident.
resource "aws_default_security_group" "this" {
  count = var.vpc_id == null ? 1 : 0

  vpc_id = aws_vpc.this[0].id
  tags   = { Name = "${var.cluster_name}-default-closed" }
}

resource "aws_internet_gateway" "this" {
  count = var.vpc_id == null ? 1 : 0

  vpc_id = aws_vpc.this[0].id
  tags   = { Name = "${var.cluster_name}-igw" }
}

resource "aws_subnet" "this" {
  count = var.subnet_id == null ? 1 : 0

  vpc_id            = aws_vpc.this[0].id
  cidr_block        = cidrsubnet(var.vpc_cidr, 8, 1)
  availability_zone = local.zone
  # Public addresses are requested per instance (compute.tf), not handed to everything in the subnet.
  map_public_ip_on_launch = false

  tags = { Name = "${var.cluster_name}-subnet" }

  lifecycle {
    precondition {
      condition     = local.zone != "none"
      error_message = "No availability zone of ${var.region} offers ${local.instance_type}; pick another REGION or INSTANCE_TYPE, or give availability_zone."
    }
  }
}

resource "aws_route_table" "this" {
  count = var.vpc_id == null ? 1 : 0

  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this[0].id
  }

  tags = { Name = "${var.cluster_name}-rt" }
}

resource "aws_route_table_association" "this" {
  count = var.subnet_id == null ? 1 : 0

  subnet_id      = aws_subnet.this[0].id
  route_table_id = aws_route_table.this[0].id
}

resource "aws_subnet" "spare" {
  for_each = toset(local.spare_zones)

  vpc_id                  = aws_vpc.this[0].id
  cidr_block              = cidrsubnet(var.vpc_cidr, 8, 2 + index(local.offered_zones, each.key))
  availability_zone       = each.key
  map_public_ip_on_launch = false

  tags = { Name = "${var.cluster_name}-subnet-${each.key}" }
}

resource "aws_route_table_association" "spare" {
  for_each = aws_subnet.spare

  subnet_id      = each.value.id
  route_table_id = aws_route_table.this[0].id
}

data "aws_subnet" "existing" {
  count = var.subnet_id == null ? 0 : 1

  id = var.subnet_id
}

locals {
  vpc_id    = var.vpc_id == null ? aws_vpc.this[0].id : var.vpc_id
  subnet_id = var.subnet_id == null ? aws_subnet.this[0].id : var.subnet_id
  # The block every node's address is in (the inventory's `subnet`: MPI's and gloo's interface choice): the VPC's,
  # which holds the subnet of each zone, or the existing subnet's.
  subnet_cidr = var.subnet_id == null ? aws_vpc.this[0].cidr_block : data.aws_subnet.existing[0].cidr_block

  # Each node's zone and subnet: the cluster's, or the one node_zones moved it to.
  node_zone   = [for i in range(var.nodes) : lookup(var.node_zones, tostring(i), local.zone)]
  node_subnet = [for z in local.node_zone : z == local.zone ? local.subnet_id : try(aws_subnet.spare[z].id, null)]
}
