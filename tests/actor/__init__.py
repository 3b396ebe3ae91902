"""The session actor, its batch engine, the registry, subscriptions, compaction, telemetry."""
