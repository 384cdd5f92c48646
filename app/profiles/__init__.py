"""Speaker profiles: made from a recording (speaker encoder, style search, prosody) and stored on disk."""
