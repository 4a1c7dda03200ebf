"""Every job's supervision (a job on one host is a group of one) and what multi-host jobs add:
one job on N hosts, one executor per host as that node's agent, the console the coordinator (rendezvous per epoch, two-phase commit of sharded checkpoints, a lost member
replaced by a spare at the same world size)."""
