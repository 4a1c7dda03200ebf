"""The controller as a service: it runs detached (``hotspare serve``), owns the state dir and
the leases, and outlives every view; views (``hotspare``) and ``hotspare stop`` reach it
through the control socket in the state dir."""
