"""What the tests stand on: real sshd hosts (sshbed), network namespaces (netbed), a fleet of
local or sshd hosts with their inventory (fleetbed), a three-member job (groupbed), an etcd
cluster (etcdbed), the lease bounds the fencing tests hold a run to (lease_bounds), watching an
executor's events (event_watch), references made once per test run whichever xdist worker asks
first (once), and small helpers (helpers: polling with a deadline, disks).

What several test modules share lives here too, so that no test module imports another's: the
console's UI (uibed, tmuxbed), a job's supervisor alone (jobbed), checkpoints (checkpointbed),
multi-host and command-kind executors (distbed, commandbed), fencing (fencingbed), probes
(probebed), the console offline (offlinebed), the controller service (servicebed) and
replication (replicabed).
"""
