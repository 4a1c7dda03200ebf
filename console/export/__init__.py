"""Metrics the console sends where users already look (TensorBoard), with no change to their
training script: ``points`` says what a run's numbers are, ``tensorboard`` writes them."""
