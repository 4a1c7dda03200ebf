"""The test bed's etcd cluster starts whole: every member answering, not only a quorum.

A suite run failed at 06e3719: ``test_etcd_one_member_lost_...`` killed one member of three
and the leader lost its quorum, because another member had never come up (its port, free
when the bed chose it, was taken before etcd bound it). The bed had waited only for a write
to land, which two members allow."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from support.etcdbed import EtcdCluster

from console.service.etcd import Etcd

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd-server is needed")


def test_a_member_whose_port_was_taken_makes_the_bed_start_again_on_other_ports(
    tmp_path: Path,
) -> None:
    cluster = EtcdCluster(tmp_path)
    taken = cluster.client["m2"]
    squatter = socket.socket()  # another process took m2's client port after it was chosen
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", taken))
    squatter.listen()
    try:
        cluster.start(timeout=30)
        try:
            assert taken not in cluster.client.values()
            assert all(cluster.alive(n) for n in cluster.names)
            for endpoint in cluster.endpoints:  # each member answers a write on its own
                Etcd([endpoint]).txn([], [])
            cluster.kill("m0")  # one lost of three still leaves a quorum
            Etcd(cluster.endpoints, timeout_s=5).txn([], [])
        finally:
            cluster.stop()
    finally:
        squatter.close()
