"""What the spot day watches from outside (bench.spotday_watch), on files and clocks given to it: every instance's
paid life, back-dated by its launch, and every head's sample log read as it grows, across a new head."""

from __future__ import annotations

import os

import pytest

from bench import spotday_watch
from bench.spotday_watch import Instances, SampleLog


def test_an_instance_is_paid_from_its_launch_to_its_end_and_a_taken_node_costs_nothing(monkeypatch):
    spaces = {"ns-0": (1, 1), "ns-1": (2, 1)}
    monkeypatch.setattr(spotday_watch, "namespace_id", lambda name: spaces.get(name))
    instances = Instances(["ns-0", "ns-1"])
    instances.poll(now=0.0)
    del spaces["ns-1"]  # node-1 lost: its namespace gone
    instances.poll(now=10.0)
    instances.booting[1] = 20.0  # its replacement took 20 s to launch; it appears at 40 s
    spaces["ns-1"] = (3, 1)
    instances.poll(now=40.0)
    instances.close(100.0)
    assert instances.paid(0.0, 100.0) == pytest.approx(100 + 10 + 80)
    assert instances.paid(50.0, 100.0) == pytest.approx(100)


def test_a_replacement_launched_beside_a_noticed_node_is_paid_from_its_launch(monkeypatch, tmp_path):
    """The local provider notes when a replacement's launch began (faults.note_launch): beside a noticed node the new
    namespace is made only after that node's stay, later than the launch time given (``booting``) says."""
    from multinode.providers.local import faults

    spaces = {"ns-0": (1, 1)}
    monkeypatch.setattr(spotday_watch, "namespace_id", lambda name: spaces.get(name))
    monkeypatch.setattr(spotday_watch.time, "time", lambda: 1000.0)
    instances = Instances(["ns-0"], provider_dir=tmp_path)
    instances.poll(now=0.0)
    (tmp_path / f"{faults.LAUNCH_PREFIX}node-0").write_text("900.0\n")  # launched 100 s before it appears
    instances.booting[0] = 49.0  # what the trace gave its launch
    spaces["ns-0"] = (2, 1)
    instances.poll(now=150.0)
    assert instances.current(0).paid_from == pytest.approx(50.0)
    assert faults.launched_at(tmp_path, "node-0") is None  # taken once


def test_a_node_brought_back_in_its_namespace_is_a_new_instance(monkeypatch):
    monkeypatch.setattr(spotday_watch, "namespace_id", lambda name: (7, 7))
    instances = Instances(["ns-0"])
    instances.poll(now=0.0)
    first = instances.current(0)
    monkeypatch.setattr(spotday_watch.time, "monotonic", lambda: 30.0)
    instances.take(0)
    assert instances.current(0) is None and instances.ident(0) is None and first.ended == 30.0
    monkeypatch.setattr(spotday_watch.time, "monotonic", lambda: 90.0)
    instances.back(0, booting=45.0)
    assert instances.current(0).paid_from == 45.0 and instances.current(0).ident != first.ident


def test_every_heads_sample_log_is_read_whole_line_by_line_and_a_new_file_from_its_start(tmp_path):
    heads = [tmp_path / "node-0" / "samples.jsonl", tmp_path / "node-1" / "samples.jsonl"]
    for path in heads:
        path.parent.mkdir()
    log = SampleLog(heads)
    heads[0].write_text('{"step": 1}\n{"step": 2')  # the second line is being written
    log.poll()
    assert [line for _, line in log.lines] == ['{"step": 1}']
    with open(heads[0], "a") as fh:
        fh.write('}\n')
    log.poll()
    assert [line for _, line in log.lines] == ['{"step": 1}', '{"step": 2}']
    os.unlink(heads[0])  # node-0 replaced: its files go; node-1 is the head now, and node-0 a new file
    heads[1].write_text('{"step": 3}\n')
    heads[0].write_text('{"step": 9}\n')
    log.poll()
    assert [line for _, line in log.lines][2:] == ['{"step": 9}', '{"step": 3}']


def test_a_new_file_on_a_freed_inode_is_read_from_its_start(tmp_path, monkeypatch):
    """A replaced head's new samples.jsonl may get the inode its old one freed: its first line tells them apart."""
    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    log = SampleLog([path])
    log.poll()
    real_fstat = os.fstat
    monkeypatch.setattr(spotday_watch.os, "fstat",
                        lambda fd: type("S", (), {"st_ino": 5, "st_size": real_fstat(fd).st_size})())
    log._at[0] = ((5, b'{"step": 1}\n'), log._at[0][1])  # as if it had been read under inode 5
    path.write_text('{"step": 21}\n{"step": 22}\n{"step": 23}\n')  # longer than what was read: same inode, new file
    log.poll()
    assert [line for _, line in log.lines] == ['{"step": 1}', '{"step": 2}', '{"step": 21}', '{"step": 22}',
                                               '{"step": 23}']
