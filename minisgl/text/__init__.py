"""Text around the token ids: chat templating, incremental detokenization and stop strings."""
