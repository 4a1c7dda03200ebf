"""Checkpoints on the executor's side: written async and verified in one folder, read ahead and
verified before need, their lineage and the code version in their manifests.
"""
