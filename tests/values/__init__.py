"""The values: events, messages, parts, the codec, the log and transcripts."""
