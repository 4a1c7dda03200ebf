"""What keeps a run inside its lease: the run's container (a cgroup v2 where the host allows it,
else the fence process, a child subreaper) and the fence that ends it.

Standard library only: ``fence.py`` runs as a program of its own, beside the executor and
outliving it, and imports nothing else of the bundle but ``cgroup``.
"""
