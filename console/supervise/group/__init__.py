"""Multi-host jobs: one job on N hosts, one executor per host as that node's agent, the console
the coordinator (rendezvous per epoch, two-phase commit of sharded checkpoints, a lost member
replaced by a spare at the same world size)."""
