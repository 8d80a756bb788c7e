"""Checks, grading engine and command line of the autograd course."""

__version__ = "0.1.0"
