"""The executor agent itself: serving the console, requests from outside the step loop, the warm
twin, the job's workdir and its lock, events, the run's identity, progress reports, and faults
injected on purpose (``HOTSPARE_INJECT``).
"""
