# Image delivery: an ECR repository (made for the cluster, or an existing one taken by name) and an
# instance profile with AmazonEC2ContainerRegistryReadOnly, so nodes pull through the ECR credential
# helper (user data) with the instance's own short-lived credentials; no password is stored anywhere.

data "aws_partition" "current" {}

resource "aws_ecr_repository" "cluster" {
  count = var.ecr_repository == null ? 1 : 0

  name = local.unique_name
  # `make image PUSH=1` pushes the same tag again after a rebuild.
  image_tag_mutability = "MUTABLE"
  # `make down` keeps a repository that still holds images unless told otherwise (YES=1).
  force_delete = false

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
  }

  #checkov:skip=CKV_AWS_51:Tags are rebuilt and pushed again under the same name (make image PUSH=1); the node pulls what was pushed last.
}

data "aws_ecr_repository" "given" {
  count = var.ecr_repository == null ? 0 : 1

  name = var.ecr_repository
}

locals {
  ecr_repository_url = var.ecr_repository == null ? aws_ecr_repository.cluster[0].repository_url : data.aws_ecr_repository.given[0].repository_url
}

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = local.unique_name
  path               = "/multinode/"
  description        = "multinode cluster ${var.cluster_name} (${var.cluster_id}): nodes pull container images from ECR and use the S3 buckets of bucket_names"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
}

resource "aws_iam_role_policy_attachment" "ecr_read" {
  role       = aws_iam_role.node.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly"
}

# DATA and CHECKPOINT_URL from the nodes' instance profile: only the buckets named at `make up BUCKETS="a b"`.
# The actions are the ones the node code calls (training/bucket.py, training/upload.py): HeadBucket and
# ListObjectsV2 need s3:ListBucket on the bucket; GetObject, PutObject and DeleteObject (two newest copies kept)
# act on its objects (docs.aws.amazon.com/AmazonS3/latest/userguide/using-with-s3-policy-actions.html), multipart
# uploads included; kms:GenerateDataKey and kms:Decrypt for a bucket encrypted with a KMS key.
data "aws_iam_policy_document" "buckets" {
  count = length(var.bucket_names) > 0 ? 1 : 0

  statement {
    sid       = "ListTheBuckets"
    actions   = ["s3:ListBucket", "s3:GetBucketLocation"]
    resources = [for b in var.bucket_names : "arn:${data.aws_partition.current.partition}:s3:::${b}"]
  }
  statement {
    sid       = "ReadWriteTheirObjects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = [for b in var.bucket_names : "arn:${data.aws_partition.current.partition}:s3:::${b}/*"]
  }
  # SSE-KMS buckets: "To upload or download an object encrypted with an AWS KMS key ... you need kms:GenerateDataKey
  # and kms:Decrypt permissions on the key" (S3 user guide, "Using server-side encryption with AWS KMS keys"; a
  # multipart upload needs both). Which key a bucket uses is the bucket's (its default encryption), so the grant
  # names no key but holds only for S3's own requests in this region (kms:ViaService, AWS KMS developer guide,
  # "kms:ViaService") on these buckets' objects: the encryption context S3 sends is the object's ARN, or the
  # bucket's ARN with S3 Bucket Keys (S3 user guide, "Reducing the cost of SSE-KMS with Amazon S3 Bucket Keys").
  # The key's own policy must allow the account's IAM policies (a customer managed key's default policy does).
  statement {
    sid       = "UseTheirKmsKeysThroughS3"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
    condition {
      test     = "StringLike"
      variable = "kms:EncryptionContext:aws:s3:arn"
      values = flatten([for b in var.bucket_names : [
        "arn:${data.aws_partition.current.partition}:s3:::${b}", "arn:${data.aws_partition.current.partition}:s3:::${b}/*"
      ]])
    }
  }
}

resource "aws_iam_role_policy" "buckets" {
  count  = length(var.bucket_names) > 0 ? 1 : 0
  name   = "buckets"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.buckets[0].json
}

resource "aws_iam_instance_profile" "node" {
  name = local.unique_name
  path = "/multinode/"
  role = aws_iam_role.node.name
}
