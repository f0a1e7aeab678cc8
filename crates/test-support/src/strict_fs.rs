//! A strict-POSIX model of what a power cut leaves, for crash enumeration of code that writes
//! real files (the release side's stores, `chunk split`).
//!
//! The code under test runs for real on a real directory. At each of its effects (announced by
//! `chunker::effects`; the test maps them onto [`StrictFs`]'s calls) the model takes a snapshot
//! of the directory (every inode by number and birth time, so a reused inode number is a new
//! file) and keeps, apart from it, what is durable:
//! - a directory's entries are durable as they were at its last fsync ([`StrictFs::sync_dir`]):
//!   a file created, renamed or removed since is not (the rename of a temporary over its final
//!   name included);
//! - a file's bytes are durable as they were at its last fsync ([`StrictFs::sync_file`]);
//! - everything there at the start is durable; a filesystem sync ([`StrictFs::sync_all`])
//!   makes everything durable.
//!
//! From that, each crash point has three states ([`View`]): only what was made durable
//! ([`View::Synced`], the pessimistic strict-POSIX state), every entry as it is but only synced
//! bytes ([`View::EntriesKept`]: the kernel wrote the directories back on its own but not the
//! data, so an unsynced file is empty), and everything as it is ([`View::Killed`], a kill -9).
//! Arbitrary mixes of unsynced entries across directories are not enumerated: the three views
//! bound them from both sides for code that syncs a file before renaming it and a directory
//! after changing it, which is what these writers do.
//!
//! What an external program (git) makes durable is the test's to say from what the program was
//! told ([`StrictFs::sync_files`]); the model itself knows only file and directory syncs.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// An inode: its number and birth time (nanoseconds; 0 where the filesystem keeps none).
type Id = (u64, i128);

#[derive(Debug, Clone)]
enum Node {
    Dir(BTreeMap<OsString, Id>),
    File(Arc<Vec<u8>>),
}

#[derive(Debug, Clone)]
struct Snapshot {
    root: Id,
    nodes: HashMap<Id, (Node, u32)>,
}

/// One state of the directory: relative path → a directory, or a file's bytes and mode.
pub type Tree = BTreeMap<PathBuf, Entry>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir,
    File { data: Arc<Vec<u8>>, mode: u32 },
}

/// Which state a crash point is seen in (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    /// Only what was fsynced survived.
    Synced,
    /// Every directory entry survived; only fsynced bytes did (unsynced files are empty).
    EntriesKept,
    /// Everything survived (kill -9).
    Killed,
}

impl View {
    pub const ALL: [View; 3] = [View::Synced, View::EntriesKept, View::Killed];
}

fn id_of(meta: &fs::Metadata) -> Id {
    let born = meta
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    (meta.ino(), born)
}

fn snapshot(root: &Path) -> Snapshot {
    fn walk(path: &Path, nodes: &mut HashMap<Id, (Node, u32)>) -> Option<Id> {
        let meta = fs::symlink_metadata(path).ok()?;
        let id = id_of(&meta);
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            let mut entries = BTreeMap::new();
            let mut names: Vec<OsString> = fs::read_dir(path)
                .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
                .unwrap_or_default();
            names.sort();
            for name in names {
                if let Some(child) = walk(&path.join(&name), nodes) {
                    entries.insert(name, child);
                }
            }
            nodes.insert(id, (Node::Dir(entries), mode));
        } else if meta.is_file() {
            // A file that vanished between the listing and the read: skip it as gone.
            let data = fs::read(path).ok()?;
            nodes.insert(id, (Node::File(Arc::new(data)), mode));
        } else {
            return None;
        }
        Some(id)
    }
    let mut nodes = HashMap::new();
    let root_id = walk(root, &mut nodes).expect("the modelled directory exists");
    Snapshot {
        root: root_id,
        nodes,
    }
}

/// The model of one directory (module docs).
pub struct StrictFs {
    root: PathBuf,
    current: Snapshot,
    entries: HashMap<Id, BTreeMap<OsString, Id>>,
    bytes: HashMap<Id, Arc<Vec<u8>>>,
    /// Every inode ever seen, as last seen (durable entries may name one that is gone now).
    seen: HashMap<Id, (Node, u32)>,
}

impl StrictFs {
    /// Model `root` (which must exist); everything under it now is durable.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let current = snapshot(&root);
        let mut me = Self {
            root,
            seen: current.nodes.clone(),
            current,
            entries: HashMap::new(),
            bytes: HashMap::new(),
        };
        me.make_durable(|_| true);
        me
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Look at the directory again (after any effect).
    pub fn refresh(&mut self) {
        self.current = snapshot(&self.root);
        for (id, node) in &self.current.nodes {
            self.seen.insert(*id, node.clone());
        }
    }

    /// Paths (relative) of the current snapshot, with their inode.
    fn current_paths(&self) -> Vec<(PathBuf, Id)> {
        let mut out = Vec::new();
        let mut stack = vec![(PathBuf::new(), self.current.root)];
        while let Some((rel, id)) = stack.pop() {
            out.push((rel.clone(), id));
            if let Some((Node::Dir(entries), _)) = self.current.nodes.get(&id) {
                for (name, child) in entries {
                    stack.push((rel.join(name), *child));
                }
            }
        }
        out
    }

    fn make_durable(&mut self, pick: impl Fn(&Path) -> bool) {
        for (rel, id) in self.current_paths() {
            if !pick(&rel) {
                continue;
            }
            match &self.current.nodes[&id].0 {
                Node::Dir(e) => {
                    self.entries.insert(id, e.clone());
                }
                Node::File(d) => {
                    self.bytes.insert(id, Arc::clone(d));
                }
            }
        }
    }

    fn rel<'a>(&self, path: &'a Path) -> &'a Path {
        path.strip_prefix(&self.root).unwrap_or(path)
    }

    /// A file was fsynced: its bytes now are durable.
    pub fn sync_file(&mut self, path: &Path) {
        self.refresh();
        let rel = self.rel(path).to_path_buf();
        self.make_durable(|p| p == rel);
    }

    /// A directory was fsynced: its entries now are durable.
    pub fn sync_dir(&mut self, path: &Path) {
        self.sync_file(path)
    }

    /// The files (relative paths) `pick` chooses had their bytes fsynced by a program.
    pub fn sync_files(&mut self, pick: impl Fn(&Path) -> bool) {
        self.refresh();
        let files: Vec<PathBuf> = self
            .current_paths()
            .into_iter()
            .filter(|(rel, id)| matches!(self.current.nodes[id].0, Node::File(_)) && pick(rel))
            .map(|(rel, _)| rel)
            .collect();
        self.make_durable(|p| files.iter().any(|f| f == p));
    }

    /// Everything under `path` is durable (a filesystem sync).
    pub fn sync_all(&mut self, path: &Path) {
        self.refresh();
        let rel = self.rel(path).to_path_buf();
        self.make_durable(|p| p.starts_with(&rel));
    }

    /// The state a power cut now would leave, seen as `view`.
    pub fn state(&self, view: View) -> Tree {
        let mut out = Tree::new();
        let mut stack = vec![(PathBuf::new(), self.current.root)];
        while let Some((rel, id)) = stack.pop() {
            let (node, mode) = match view {
                View::Synced => self.seen.get(&id),
                _ => self.current.nodes.get(&id),
            }
            .expect("every inode named was seen");
            match node {
                Node::Dir(now) => {
                    let entries = match view {
                        View::Synced => self.entries.get(&id).cloned().unwrap_or_default(),
                        _ => now.clone(),
                    };
                    if !rel.as_os_str().is_empty() {
                        out.insert(rel.clone(), Entry::Dir);
                    }
                    for (name, child) in entries {
                        stack.push((rel.join(name), child));
                    }
                }
                Node::File(now) => {
                    let data = match view {
                        View::Killed => Arc::clone(now),
                        _ => self
                            .bytes
                            .get(&id)
                            .cloned()
                            .unwrap_or_else(|| Arc::new(Vec::new())),
                    };
                    out.insert(rel, Entry::File { data, mode: *mode });
                }
            }
        }
        out
    }
}

/// The state of `dir` as it is (every file's bytes as they are now).
pub fn tree_of(dir: &Path) -> Tree {
    let mut m = StrictFs::new(dir);
    m.refresh();
    m.state(View::Killed)
}

/// A digest of a state, to replay each distinct state once.
pub fn digest(tree: &Tree) -> [u8; 32] {
    let mut h = Sha256::new();
    for (path, entry) in tree {
        h.update(path.as_os_str().as_encoded_bytes());
        h.update([0]);
        match entry {
            Entry::Dir => h.update(b"d"),
            Entry::File { data, mode } => {
                h.update(b"f");
                h.update(mode.to_le_bytes());
                h.update((data.len() as u64).to_le_bytes());
                h.update(Sha256::digest(&data[..]));
            }
        }
    }
    h.finalize().into()
}

/// Write a state out under `dest` (created), with each file's mode.
pub fn materialize(tree: &Tree, dest: &Path) {
    fs::create_dir_all(dest).unwrap();
    for (path, entry) in tree {
        let p = dest.join(path);
        match entry {
            Entry::Dir => fs::create_dir_all(&p).unwrap(),
            Entry::File { data, mode } => {
                if let Some(parent) = p.parent() {
                    fs::create_dir_all(parent).unwrap();
                }
                fs::write(&p, &data[..]).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).unwrap();
            }
        }
    }
}

/// The files of a state under `prefix` (relative), by their path below it.
pub fn files_under(tree: &Tree, prefix: &Path) -> BTreeMap<PathBuf, Arc<Vec<u8>>> {
    tree.iter()
        .filter_map(|(p, e)| match e {
            Entry::File { data, .. } => {
                let rel = p.strip_prefix(prefix).ok()?;
                Some((rel.to_path_buf(), Arc::clone(data)))
            }
            Entry::Dir => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tree: &Tree, p: &str) -> Option<Vec<u8>> {
        match tree.get(Path::new(p)) {
            Some(Entry::File { data, .. }) => Some(data.to_vec()),
            _ => None,
        }
    }

    /// The model's three rules, one by one: an entry is durable only once its directory is
    /// synced, bytes only once the file is, a rename only once its directory is.
    #[test]
    fn only_what_was_synced_survives_in_the_synced_view() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::write(root.join("old"), b"old").unwrap();
        let mut m = StrictFs::new(root);

        fs::create_dir(root.join("d")).unwrap();
        fs::write(root.join("d/f"), b"new").unwrap();
        m.refresh();
        let s = m.state(View::Synced);
        assert!(
            !s.contains_key(Path::new("d")),
            "a new directory, parent not synced"
        );
        assert_eq!(file(&m.state(View::EntriesKept), "d/f"), Some(vec![]));
        assert_eq!(file(&m.state(View::Killed), "d/f"), Some(b"new".to_vec()));

        m.sync_file(&root.join("d/f"));
        m.sync_dir(&root.join("d"));
        assert!(!m.state(View::Synced).contains_key(Path::new("d")));
        m.sync_dir(root);
        assert_eq!(file(&m.state(View::Synced), "d/f"), Some(b"new".to_vec()));

        // A rename over a durable file: the old bytes stay until the directory is synced.
        fs::write(root.join(".tmp-x"), b"newer").unwrap();
        m.sync_file(&root.join(".tmp-x"));
        fs::rename(root.join(".tmp-x"), root.join("old")).unwrap();
        m.refresh();
        let s = m.state(View::Synced);
        assert_eq!(file(&s, "old"), Some(b"old".to_vec()));
        // The temporary's own entry was never synced either.
        assert_eq!(file(&s, ".tmp-x"), None);
        assert_eq!(
            file(&m.state(View::EntriesKept), "old"),
            Some(b"newer".to_vec())
        );
        m.sync_dir(root);
        let s = m.state(View::Synced);
        assert_eq!(file(&s, "old"), Some(b"newer".to_vec()));
        assert!(!s.contains_key(Path::new(".tmp-x")));

        // Bytes changed in place and not synced: the synced bytes.
        fs::write(root.join("old"), b"rewritten").unwrap();
        m.refresh();
        assert_eq!(file(&m.state(View::Synced), "old"), Some(b"newer".to_vec()));
        m.sync_all(root);
        assert_eq!(
            file(&m.state(View::Synced), "old"),
            Some(b"rewritten".to_vec())
        );
    }
}
