"""Issue 47 item 7: the IMDSv2 session token is renewed before it expires, not only after a 401 (training/imds.py).
Recorded answers: the client's HTTP replaced by a stand-in that hands out tokens and checks their age on the given
clock, as the service does (AWS's IMDSv2 page: a token lives its TTL, a read with an expired one gets 401)."""

from __future__ import annotations

from training import imds


class Service(imds.MetadataClient):
    """A token service on a fake clock: each PUT is a new token valid for ``ttl`` seconds; reads with an expired
    token get 401, as IMDS answers them."""

    def __init__(self, ttl: int):
        self.now = 0.0
        super().__init__("http://169.254.169.254", ttl=ttl, clock=lambda: self.now)
        self.issued: dict[str, float] = {}
        self.log: list[str] = []

    def _request(self, req):
        if req.get_method() == "PUT":
            token = f"t{len(self.issued)}"
            self.issued[token] = self.now + int(req.get_header("X-aws-ec2-metadata-token-ttl-seconds"))
            self.log.append(f"PUT {token}")
            return 200, token
        token = req.get_header("X-aws-ec2-metadata-token")
        if self.issued.get(token, -1) <= self.now:
            self.log.append(f"GET 401 {token}")
            return 401, ""
        self.log.append(f"GET 404 {token}")
        return 404, ""


def test_the_token_is_renewed_before_it_expires_not_after_a_401():
    service = Service(ttl=60)
    assert service.get(imds.INSTANCE_ACTION) is None
    service.now = 30.0  # well within its life: the same token
    assert service.get(imds.INSTANCE_ACTION) is None
    service.now = 59.0  # 1 s left (the renewal margin is 12 s here, a fifth of 60): a new token first
    assert service.get(imds.INSTANCE_ACTION) is None
    assert service.log == ["PUT t0", "GET 404 t0", "GET 404 t0", "PUT t1", "GET 404 t1"]  # no read was refused
    assert "GET 401" not in " ".join(service.log)


def test_a_token_the_service_refuses_is_still_replaced_once():
    service = Service(ttl=300)
    service.get(imds.INSTANCE_ACTION)
    service.issued["t0"] = -1.0  # revoked (e.g. the instance was stopped and started)
    assert service.get(imds.INSTANCE_ACTION) is None
    assert service.log == ["PUT t0", "GET 404 t0", "GET 401 t0", "PUT t1", "GET 404 t1"]
