//! Routing: what a URL path names in the mounts (a file, a bucket tree listing, or nothing).

use fs_err as fs;
use std::path::PathBuf;

use chunker::atomic::is_temp_name;

use crate::github::github_to_bucket;
use crate::paths::{StorePath, to_fs_path};

use super::{MountKind, ServeConfig};

/// What a URL path names: a file in a mount, a tree listing, or nothing.
pub(crate) enum Route {
    /// `/`: a short index of the mounts.
    Index,
    File(PathBuf),
    Tree {
        root: PathBuf,
        prefix: Option<StorePath>,
    },
    NotFound,
}

pub(crate) fn route(config: &ServeConfig, path: &str) -> Route {
    if path == "/" && !config.mounts.iter().any(|m| m.prefix == "/") {
        return Route::Index;
    }
    for m in &config.mounts {
        if let Some(bucket) = &m.tree_api_bucket {
            let api = format!("/api/buckets/{bucket}/tree");
            if path == api || path == format!("{api}/") {
                return Route::Tree {
                    root: m.root.clone(),
                    prefix: None,
                };
            }
            if let Some(rest) = path.strip_prefix(&format!("{api}/")) {
                return match rest.parse::<StorePath>() {
                    Ok(p) => Route::Tree {
                        root: m.root.clone(),
                        prefix: Some(p),
                    },
                    Err(_) => Route::NotFound,
                };
            }
        }
        let Some(rest) = path.strip_prefix(&m.prefix) else {
            continue;
        };
        let Ok(rel) = rest.parse::<StorePath>() else {
            return Route::NotFound;
        };
        let rel = match m.kind {
            MountKind::Identity => rel,
            MountKind::Github => match github_to_bucket(&rel) {
                Some(p) => p,
                None => return Route::NotFound,
            },
        };
        if rel.segments().any(is_temp_name) {
            return Route::NotFound;
        }
        let full = to_fs_path(&rel, &m.root);
        // Symlinks inside the store must not lead out of it.
        let (Ok(root), Ok(real)) = (fs::canonicalize(&m.root), fs::canonicalize(&full)) else {
            return Route::NotFound;
        };
        if !real.starts_with(&root) {
            return Route::NotFound;
        }
        return Route::File(real);
    }
    Route::NotFound
}
