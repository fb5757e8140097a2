"""The hardened Docker executor: the node's safety boundary."""
