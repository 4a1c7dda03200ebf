"""One job's supervision, one host or a group (a group of one): the one supervisor, given the
services the controller lends it; where the job trains and its spares, where its first epoch
starts, a run found at console start; what a lost link means, a job's messages and lease, its
incident, an operator's orders, executors readied ahead of need, the launcher and the probe of
its hosts; group/ for what an epoch is made of (its watch, rendezvous, commits, recovery,
resume step, warm executors, elastic growth).
"""
