"""The spot-notice watcher on AWS's documented bodies, the agreement on one step, snapshot checksums and
replicas, and the local endpoint's answers -- pure: no sockets, no processes (the real endpoint and the real
job run in tests/integration/test_preempt_local.py)."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from multinode.core.errors import UserError
from multinode.providers.local import imds as local_imds
from training import imds, preempt, replica, snapshot

# The bodies exactly as AWS documents them (cited in training/imds.py).
INSTANCE_ACTION = '{"action": "terminate", "time": "2017-09-18T08:22:00Z"}'
REBALANCE = '{"noticeTime": "2020-11-05T08:22:00Z"}'


def test_interruption_notice_is_parsed():
    notice = imds.parse_instance_action(INSTANCE_ACTION)
    assert (notice.kind, notice.action, notice.time) == ("interruption", "terminate", "2017-09-18T08:22:00Z")
    assert "terminate at 2017-09-18T08:22:00Z" in notice.describe()
    for action in ("stop", "hibernate"):
        assert imds.parse_instance_action(json.dumps({"action": action, "time": "t"})).action == action


def test_rebalance_recommendation_is_parsed():
    notice = imds.parse_rebalance(REBALANCE)
    assert (notice.kind, notice.time) == ("rebalance", "2020-11-05T08:22:00Z")


@pytest.mark.parametrize("body", ["", "<html>", "[]", '{"action": "reboot", "time": "t"}', '{"action": "stop"}'])
def test_bodies_aws_does_not_send_are_refused(body):
    with pytest.raises(imds.BadNotice):
        imds.parse_instance_action(body)


class FakeClient(imds.MetadataClient):
    """The client's HTTP replaced by a table {(method, path): (status, body)}; counts token requests."""

    def __init__(self, table):
        super().__init__("http://imds.test")
        self.table, self.puts = table, 0

    def _request(self, req):
        if req.get_method() == "PUT":
            self.puts += 1
            assert req.get_header(imds.TOKEN_TTL_HEADER.capitalize()) is not None
        else:
            assert req.get_header(imds.TOKEN_HEADER.capitalize()) == "tok"
        return self.table.get((req.get_method(), req.full_url.removeprefix(self.base)), (404, ""))


def test_no_notice_is_404_on_both_paths():
    client = FakeClient({("PUT", imds.TOKEN_PATH): (200, "tok")})
    assert client.poll() is None and client.puts == 1
    assert client.poll() is None and client.puts == 1  # the token is kept


def test_interruption_wins_over_rebalance():
    client = FakeClient({("PUT", imds.TOKEN_PATH): (200, "tok"), ("GET", imds.INSTANCE_ACTION): (200, INSTANCE_ACTION),
                         ("GET", imds.REBALANCE): (200, REBALANCE)})
    assert client.poll().kind == "interruption"
    client.table.pop(("GET", imds.INSTANCE_ACTION))
    assert client.poll().kind == "rebalance"


def test_refused_token_is_an_error_not_a_notice():
    with pytest.raises(OSError):
        FakeClient({("PUT", imds.TOKEN_PATH): (403, "")}).poll()


def test_endpoint_follows_the_sdk_variable():
    assert imds.endpoint({}) == "http://169.254.169.254"
    assert imds.endpoint({imds.ENDPOINT_ENV: "http://10.0.0.1:8080/"}) == "http://10.0.0.1:8080"


def test_grace_must_be_positive_seconds():
    assert preempt.grace_from_env({}) is None and preempt.grace_from_env({preempt.GRACE_ENV: "30"}) == 30.0
    for bad in ("soon", "0", "-5"):
        with pytest.raises(ValueError, match=preempt.GRACE_ENV):
            preempt.grace_from_env({preempt.GRACE_ENV: bad})


def test_notice_poll_is_aws_5_s_unless_set_to_positive_seconds():
    assert preempt.poll_from_env({}) == 5.0 and preempt.poll_from_env({preempt.POLL_ENV: "0.5"}) == 0.5
    for bad in ("often", "0", "-1", "nan"):
        with pytest.raises(ValueError, match=preempt.POLL_ENV):
            preempt.poll_from_env({preempt.POLL_ENV: bad})


def test_signal_is_a_notice_with_a_deadline():
    watcher = preempt.Watcher(None, grace=30.0)
    watcher._on_signal(signal.SIGTERM, None)
    assert watcher.requested() and watcher.notice.describe() == "SIGTERM (signal)"
    assert 29 < watcher.seconds_left() <= 30


def test_every_rank_stops_at_the_same_step():
    """Three ranks in lockstep; rank 1 gets the notice at step 7. The reduced flag makes all stop together,
    at the first check after it, and the check interval is the same on every rank."""
    watchers = [preempt.Watcher(None, grace=10.0) for _ in range(3)]
    pending: list[list[float]] = []

    def reducer(rank):
        def reduce(values):  # a MAX all-reduce, computed over what every rank contributes at this check
            pending.append(values)
            return [max(v[0] for v in every) for every in [notices()]][0], 0.01
        return reduce

    def notices():
        return [[1.0 if w.requested() else 0.0] for w in watchers]

    agreements = [preempt.Agreement(w, reducer(r)) for r, w in enumerate(watchers)]
    stopped = {}
    for step in range(1, 500):
        if step == 7:
            watchers[1].note(imds.Notice("interruption", "terminate", "t"))
        for rank, agreement in enumerate(agreements):
            if rank not in stopped and agreement.step():
                stopped[rank] = step
        if stopped:
            break
    assert len(stopped) == 3 and len(set(stopped.values())) == 1 and stopped[0] >= 7
    assert all(a.next_check == agreements[0].next_check for a in agreements)


def test_no_source_means_no_collective():
    calls = []
    agreement = preempt.Agreement(preempt.Watcher(None, None), lambda v: calls.append(v) or v)
    assert not any(agreement.step() for _ in range(100)) and calls == []


def test_a_copy_that_fails_its_checksum_is_never_loaded(tmp_path):
    snapshot.save(tmp_path, {"next_epoch": 3})
    good = snapshot.read(tmp_path)
    (tmp_path / snapshot.NAME).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert snapshot.read(tmp_path) is None
    (tmp_path / snapshot.SUM).unlink()  # a snapshot from before checksums is taken as it is
    assert snapshot.read(tmp_path) is not None


def test_the_freshest_complete_copy_wins_replica_included(tmp_path):
    snapshot.save(tmp_path, {"next_epoch": 4})
    snapshot.save(tmp_path / snapshot.REPLICA, {"next_epoch": 4, "batch": 9})
    key, blob = snapshot.freshest_here(tmp_path)
    assert key == 4 * snapshot.BATCH_SPAN + 9 and snapshot.decode(blob)["batch"] == 9
    assert snapshot.freshest_here(tmp_path / "none") == (-1, None)


def test_the_buddy_is_the_first_rank_on_another_host():
    assert replica.buddy_of(["a", "a", "b", "c"]) == 2
    assert replica.buddy_of(["a", "a"]) is None
    copies = replica.Copies([(0, "a", "/r/snapshot.pt"), (2, "b", "/r/replica/snapshot.pt")])
    assert copies.describe() == "a:/r/snapshot.pt (rank 0), b:/r/replica/snapshot.pt (rank 2)"


def test_local_endpoint_answers_404_until_the_notice_is_visible():
    notice = {"kind": "interruption", "action": "terminate", "visible_at": 1000.0, "action_at": 1120.0}
    assert local_imds.notice_bodies(None, 5000.0) == {}
    assert local_imds.notice_bodies(notice, 999.0) == {}
    bodies = local_imds.notice_bodies(notice, 1000.0)
    assert imds.parse_instance_action(bodies[local_imds.INSTANCE_ACTION]).time == "1970-01-01T00:18:40Z"
    assert imds.parse_rebalance(bodies[local_imds.REBALANCE]).time == "1970-01-01T00:16:40Z"
    only = local_imds.notice_bodies({**notice, "kind": "rebalance"}, 1000.0)
    assert set(only) == {local_imds.REBALANCE}


def test_local_paths_are_the_watchers():
    assert (local_imds.INSTANCE_ACTION, local_imds.REBALANCE, local_imds.TOKEN_PATH) == (
        imds.INSTANCE_ACTION, imds.REBALANCE, imds.TOKEN_PATH)
    assert local_imds.ENDPOINT == imds.DEFAULT_ENDPOINT


def test_arming_a_notice_refuses_bad_input(tmp_path):
    from multinode.core.state import ClusterState

    state = ClusterState.for_cluster("nope", root=tmp_path)
    with pytest.raises(UserError, match="not up"):
        local_imds.arm_notice(state, "node-1", 1.0)
    with pytest.raises(UserError, match="IN=-1"):
        local_imds.arm_notice(state, "node-1", -1.0)


def test_mid_epoch_snapshot_state_round_trips(tmp_path):
    snapshot.save(tmp_path, {"next_epoch": 2, "batch": 9, "w": torch.arange(3.0)})
    state = snapshot.decode(snapshot.read(tmp_path))
    assert snapshot.freshness(state) == 2 * snapshot.BATCH_SPAN + 9


def test_guard_refuses_bad_input_in_one_line(capsys):
    from training import guard

    for argv in (["--grace", "0", "--", "true"], ["--grace", "5"], ["--grace", "x", "--", "true"],
                 ["--grace", "5", "--poll", "0", "--", "true"]):
        with pytest.raises(SystemExit) as exit_:
            guard.parse(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err, err
    assert guard.parse(["--grace", "5", "--", "python", "x.py"]).command == ["python", "x.py"]


def test_the_guard_takes_the_ranks_switches():
    """MULTINODE_NOTICES=off: no metadata reads; MULTINODE_NOTICE_POLL: the interval unless --poll gives one (the
    guard's processes: tests/integration/test_guard_switches.py)."""
    from training import guard

    endpoint = {imds.ENDPOINT_ENV: "http://127.0.0.1:9"}
    assert guard.notice_settings(endpoint, None) == (True, imds.POLL_SECONDS)
    assert guard.notice_settings({**endpoint, preempt.SWITCH_ENV: "off"}, None)[0] is False
    assert guard.notice_settings({**endpoint, preempt.POLL_ENV: "0.5"}, None) == (True, 0.5)
    assert guard.notice_settings({**endpoint, preempt.POLL_ENV: "0.5"}, 2.0) == (True, 2.0)
    with pytest.raises(ValueError, match=preempt.POLL_ENV):
        guard.notice_settings({preempt.POLL_ENV: "-1"}, None)


def test_a_guard_ending_preempted_notes_it_and_under_torchrun_signals_its_agent(tmp_path, monkeypatch):
    from training import guard
    sent = []
    monkeypatch.setattr(guard.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(guard.os, "getppid", lambda: 4242)
    mark = tmp_path / "preempted"
    guard.preempted({guard.MARK_ENV: str(mark)})  # not under torchrun: the note only
    assert mark.is_file() and sent == []
    guard.preempted({"TORCHELASTIC_RUN_ID": "r1"})  # a torchrun worker: its agent shuts down instead of restarting
    assert sent == [(4242, signal.SIGTERM)]
    guard.preempted({guard.MARK_ENV: str(tmp_path / "no" / "such" / "dir")})  # cannot write it: said, not raised


def test_the_guards_command_does_not_carry_the_guards_own_mark():
    from training import guard
    assert guard._command_env({"MULTINODE_GUARD": "1", "RANK": "3"}) == {"RANK": "3"}
