"""The built-in ``torch`` kind: a workload trained by the step loop (resume, train, checkpoint,
stop), its step boundary, one epoch's process group, logical ranks, RNG capture, the device,
FSDP2, the idle warm-up, and the built-in workloads.
"""
