"""The built-in ``command`` kind: any training command run with the same failover (its plumbing,
setup, warm start from a zygote, the checkpoints it writes, files or folders, and who may still
be writing them).
"""
