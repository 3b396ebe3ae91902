"""Fault injection: lost replies, killed backends, dead connections, unknown outcomes."""
