"""The producer side of draftgen: reading datasets into prompts, enqueueing them, status, export."""
