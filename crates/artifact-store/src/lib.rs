//! Store trait and backends (local dir, Hugging Face bucket, GitHub Models branch), publish, reuse, serve. Filled in by its own issue.
