//! Device state (params, /data/models), crash-safe generation migration, fallback, locking. Filled in by its own issue.
