"""Checkpoints copied to the spares before anything fails: the replicator (what to
copy, where, when), the copy over the console (one receiver program per copy, its rules and
stream), and host-to-host copies (scoped keys, a sender and a receiver on the hosts).
"""
