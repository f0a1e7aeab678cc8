//! Device-side download: origins, manifest fetch, parallel verified resumable chunk download, atomic install. Filled in by its own issue.
