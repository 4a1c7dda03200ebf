"""Spare supply: where a job is placed and its spares chosen, which hosts a failover may
target, spares kept fit while the job runs, and the jobs' side of the provisioner.
"""
