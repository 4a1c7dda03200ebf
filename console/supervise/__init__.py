"""One job's supervision, one host or a group: the supervisor (what every job's
supervisor has, given the services the controller lends it), what a lost link means, a job's
messages and lease, its incident, an operator's orders, recovery (restart in place, failover),
executors readied ahead of need, the launcher and the probe of its hosts; group/ for multi-host
jobs.
"""
