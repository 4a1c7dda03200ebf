"""Ways to reach a host: ``local`` (this machine) and ``ssh`` (asyncssh), behind one interface."""
