# The cluster network: a VPC with one public subnet (one AZ, as a cluster placement group needs),
# or an existing subnet given by id.

# The zones of the region that offer the instance type (GPU types are not offered in every zone);
# read only when the subnet is created here and no zone is given.
data "aws_ec2_instance_type_offerings" "zones" {
  count = var.subnet_id == null && var.availability_zone == null ? 1 : 0

  location_type = "availability-zone"
  filter {
    name   = "instance-type"
    values = [local.instance_type]
  }
}

locals {
  # The first offering zone by name, so the choice is stable between plans.
  offered_zones = sort(flatten(data.aws_ec2_instance_type_offerings.zones[*].locations))
  zone          = coalesce(var.availability_zone, try(local.offered_zones[0], "none"))
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

data "aws_subnet" "existing" {
  count = var.subnet_id == null ? 0 : 1

  id = var.subnet_id
}

locals {
  vpc_id      = var.vpc_id == null ? aws_vpc.this[0].id : var.vpc_id
  subnet_id   = var.subnet_id == null ? aws_subnet.this[0].id : var.subnet_id
  subnet_cidr = var.subnet_id == null ? aws_subnet.this[0].cidr_block : data.aws_subnet.existing[0].cidr_block
}
