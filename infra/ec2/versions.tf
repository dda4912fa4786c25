# Cross-variable validation (instance_type vs cluster_type) needs Terraform >= 1.9.
# The AWS provider is pinned to the tested 5.x line; .terraform.lock.hcl (committed, as for any root
# module) fixes the exact release, 5.100.0, with its checksums for every platform.
terraform {
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}
