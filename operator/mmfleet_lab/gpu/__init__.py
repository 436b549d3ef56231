"""Measurements made on a lent GPU machine with the standard library only (copied there alone)."""
