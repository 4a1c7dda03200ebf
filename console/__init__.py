"""What runs on the operator's machine: inventory, transports, the fleet controller and the TUI."""
