"""Host health for the executor's ``Health`` message, and the one place it talks to NVML."""
