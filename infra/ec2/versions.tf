# Cross-variable validation (instance_type vs cluster_type) needs Terraform >= 1.9.
terraform {
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40.0, < 7.0.0"
    }
  }
}
