"""What runs on a GPU host: trains a job resumably and speaks the protocol to the console."""

__version__ = "0.1.0"
