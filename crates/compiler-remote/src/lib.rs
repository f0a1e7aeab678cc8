//! The compiler comma over SSH and rsync: sync, marker check, stage, compile, fetch. Filled in by its own issue.
