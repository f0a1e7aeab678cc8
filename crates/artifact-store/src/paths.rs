//! Small helpers over `manifest::StorePath` (the one store-path type of the workspace, which
//! already rules out absolute paths, `..`, empty segments and backslashes).

use std::path::{Path, PathBuf};

pub use manifest::StorePath;

use crate::error::{Error, Result};

/// Parse a store path, naming it in the error.
pub fn store_path(s: &str) -> Result<StorePath> {
    s.parse().map_err(|e: manifest::Error| Error::InvalidPath {
        path: s.to_string(),
        reason: e.to_string(),
    })
}

/// `path` under a local directory.
pub fn to_fs_path(path: &StorePath, root: &Path) -> PathBuf {
    let mut p = root.to_path_buf();
    for seg in path.segments() {
        p.push(seg);
    }
    p
}

/// Whether `path` is `prefix` or lies below it, segment-wise (`models/v2` is not a prefix of
/// `models/v25/x`).
pub fn is_under(path: &StorePath, prefix: &StorePath) -> bool {
    let (p, q) = (path.as_str(), prefix.as_str());
    p == q || (p.starts_with(q) && p.as_bytes().get(q.len()) == Some(&b'/'))
}

/// Everything before the last segment, if there is anything.
pub fn parent(path: &StorePath) -> Option<StorePath> {
    path.as_str()
        .rsplit_once('/')
        .map(|(p, _)| p.parse().expect("a prefix of a valid path is valid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_segment_wise() {
        let p = store_path("models/v25/x").unwrap();
        assert!(is_under(&p, &store_path("models/v25").unwrap()));
        assert!(is_under(&p, &store_path("models/v25/x").unwrap()));
        assert!(!is_under(&p, &store_path("models/v2").unwrap()));
        assert_eq!(parent(&p).unwrap().as_str(), "models/v25");
        assert_eq!(parent(&store_path("x").unwrap()), None);
        assert_eq!(
            to_fs_path(&p, Path::new("/r")),
            PathBuf::from("/r/models/v25/x")
        );
        assert!(store_path("../x").is_err());
    }
}
