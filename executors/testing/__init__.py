"""Test doubles shipped in the bundle: the fake NVML (``HOTSPARE_FAKE_NVML``). Production code
imports it only when a test asked for it (``health/gpu.py``, inside a function).
"""
