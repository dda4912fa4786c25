"""Failure drills on a real local cluster: inject a fault into a running job, measure how long the
job takes to end, and count the processes of ours left on every node.

    python -m bench.drills [--out docs/reliability.md]     (brings a 3-node cluster up and down)

Every drill runs the same job through the real CLI (a user script doing an all_reduce every 0.2 s
on 3 nodes, ``--pg-timeout 10``), waits until every node has done a few steps, injects the fault
into node-1 (or the orchestrator), and records: exit code, seconds from the fault to the
orchestrator's exit, which node the error names first, and the processes left on each node once
the orchestrator has exited (and, for faults that isolate a node, once the node is reachable again).
The integration tests (tests/integration/test_drills.py) run the same drills and assert on
outcomes; timings are only reported.

* :mod:`bench.drills.common`: output watchers and process lookups every drill uses;
* :mod:`bench.drills.crashes`: faults in a running job, and faults present before it starts;
* :mod:`bench.drills.elastic`: faults under MAX_RESTARTS=1, which the job must survive;
* :mod:`bench.drills.hangs`: a rank that stops making progress, which the orchestrator must name;
* :mod:`bench.drills.page`: docs/reliability.md from their results; ``__main__``: runs them all.
"""
