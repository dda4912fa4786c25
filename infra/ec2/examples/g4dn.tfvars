# Manual use: terraform -chdir=infra/ec2 apply -var-file=examples/g4dn.tfvars -var ssh_cidr=203.0.113.4/32
# (make up PROVIDER=aws CLUSTER_TYPE=g4dn writes these, plus the generated keys, for you.)
cluster_name  = "g4dn-demo"
cluster_id    = "0a1b2c" # make up draws a random one per cluster
region        = "us-east-1"
cluster_type  = "g4dn"
instance_type = "g4dn.xlarge"
nodes         = 2
owner         = "alice"
ttl_hours     = 4
expires_at    = "2026-11-22T18:00:00Z"
spot          = false
# image = "<account>.dkr.ecr.us-east-1.amazonaws.com/multinode-<kind>:latest"  # unset: jobs run in the host runtime
ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleOnlyReplaceWithYourKey alice@laptop"
# host_keys: one ed25519 pair per node; generate with ssh-keygen -t ed25519 (multinode does it).
