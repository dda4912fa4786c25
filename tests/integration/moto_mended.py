"""moto's server (moto.server.main, what the ``moto_server`` script runs) with one mend of moto 5.2.5, so a second
``terraform apply`` against it finds what it made as it made it -- as against EC2:

* A security group rule that references a group (``aws_vpc_security_group_ingress_rule`` with
  ``referenced_security_group_id``: the cluster's own rule, infra/ec2/security.tf) keeps the Description it was made
  with, and DescribeSecurityGroupRules returns it (EC2 API reference, SecurityGroupRule: ``description``). moto stores
  it with the referenced group (``SecurityGroupRule.source_group``) but reads a rule's description from its CIDR range
  only (moto/ec2/models/security_groups.py, ``SecurityGroupRule.description``), so Terraform saw the description gone
  and planned an update that moto then refused (ModifySecurityGroupRules: "Must specify both from and to ports with
  TCP/UDP" for protocol -1). Found by tests/integration/test_aws_lost_answer.py, whose ``up`` applies twice.
"""

import sys

from moto.ec2.models.security_groups import SecurityGroupRule
from moto.server import main


def _description(rule: SecurityGroupRule) -> "str | None":
    return rule.ip_range.get("Description") or rule.source_group.get("Description")


SecurityGroupRule.description = property(_description)

if __name__ == "__main__":
    sys.exit(main())
