"""The stores: the conformance suite on every backend, and what each backend does beyond it."""
