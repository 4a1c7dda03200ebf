"""Fault injection over a real fleet: seeded, randomized, with invariant checks."""
