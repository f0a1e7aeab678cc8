//! The staging directory: where a download's bytes are assembled before the one rename that
//! installs them, and nothing in it is followed that we did not create.
//!
//! `<models>/.starpilot-staging` is a `0700` directory owned by this user, opened `O_NOFOLLOW`
//! and checked on its descriptor; every file in it is opened relative to that descriptor with
//! `O_NOFOLLOW` (new ones `O_EXCL`), so a planted or swapped-in symlink is never followed.
//!
//! Upstream's Python cleanup never touches the name (it deletes `tmp*`, `driving_*` and
//! `*_driving_*` entries of `/data/models`, never subdirectories), and our purge and `gc` skip
//! names starting with `.`.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fs_err as fs;
use fs_err::File;
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, Stat, fstat};
use rustix::io::Errno;

use crate::error::os_error;

/// Name of the staging directory inside the models directory.
pub const STAGING_DIR: &str = ".starpilot-staging";

/// Prefix of the staging files the previous build kept directly in the models directory; they
/// are removed when the staging directory is opened.
pub const LEGACY_STAGING_PREFIX: &str = ".tmp-partial-";

/// Entries of other artifacts untouched for this long are removed when a download starts.
pub const STALE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// A download's completion record is a header line and one index (or range) per line: small by
/// construction, and read no further than this.
pub(crate) const MAX_STATE_BYTES: u64 = 64 * 1024;

/// Temporaries of [`StagingDir::write_atomic`] start with this.
const NEW_PREFIX: &str = ".new-";

/// `name` when it is a plain file name of the directory (no `/`, not `.` or `..`, no NUL).
fn plain(name: &str) -> io::Result<&str> {
    if name.is_empty() || name.contains(['/', '\0']) || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{name}` is not a plain file name"),
        ));
    }
    Ok(name)
}

/// The open, verified staging directory.
pub(crate) struct StagingDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl StagingDir {
    /// Open `<models_dir>/.starpilot-staging`, creating it, as the module docs describe.
    pub fn open(models_dir: &Path) -> io::Result<Self> {
        let path = models_dir.join(STAGING_DIR);
        for _ in 0..3 {
            // fs-err has no DirBuilder (the mode must be set at creation).
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(os_error("create directory", &path, e)),
            }
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let fd = match rustix::fs::open(&path, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    // A symlink or a file at our name: not ours. Unlinking it never touches
                    // what a symlink points to.
                    fs::remove_file(&path)?;
                    continue;
                }
                Err(e) => return Err(os_error("open directory", &path, e.into())),
            };
            let st = fstat(&fd).map_err(|e| os_error("query metadata", &path, e.into()))?;
            let me = rustix::process::geteuid().as_raw();
            if st.st_uid != me {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the staging directory {} is owned by uid {}, not by this user (uid {me}); remove it",
                        path.display(),
                        st.st_uid
                    ),
                ));
            }
            if st.st_mode & 0o077 != 0 {
                rustix::fs::fchmod(&fd, Mode::RWXU)
                    .map_err(|e| os_error("set permissions of", &path, e.into()))?;
            }
            let dir = Self { fd, path };
            dir.remove_legacy(models_dir);
            return Ok(dir);
        }
        Err(io::Error::other(format!(
            "something keeps replacing the staging directory {} with another kind of file",
            path.display()
        )))
    }

    /// The previous build's staging files, directly in the models directory.
    fn remove_legacy(&self, models_dir: &Path) {
        let Ok(entries) = fs::read_dir(models_dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name()
                .as_bytes()
                .starts_with(LEGACY_STAGING_PREFIX.as_bytes())
            {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// A file of the directory, opened relative to its descriptor; the result carries its path,
    /// so every later error on it (fs-err) names it.
    fn openat(&self, name: &str, flags: OFlags) -> io::Result<File> {
        let path = self.join(name);
        let op = if flags.contains(OFlags::CREATE) {
            "create file"
        } else {
            "open file"
        };
        let fd = plain(name)
            .and_then(|name| {
                let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                Ok(rustix::fs::openat(
                    &self.fd,
                    name,
                    flags,
                    Mode::RUSR | Mode::WUSR,
                )?)
            })
            .map_err(|e| os_error(op, &path, e))?;
        Ok(File::from_parts(std::fs::File::from(fd), path))
    }

    /// A new, empty file at `name` (whatever was there is removed first; never followed).
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        self.remove(name)?;
        self.openat(name, OFlags::RDWR | OFlags::CREATE | OFlags::EXCL)
    }

    /// The existing regular file at `name`, read-write; a symlink or anything else is refused.
    pub fn open_existing(&self, name: &str) -> io::Result<File> {
        let f = self.openat(name, OFlags::RDWR)?;
        let st = fstat(&f).map_err(|e| os_error("query metadata", f.path(), e.into()))?;
        if !is_regular(&st) {
            return Err(os_error(
                "open file",
                f.path(),
                io::Error::new(io::ErrorKind::InvalidData, "not a regular file"),
            ));
        }
        Ok(f)
    }

    /// At most `max` bytes of the regular file `name`; longer is an error.
    pub fn read_small(&self, name: &str, max: u64) -> io::Result<Vec<u8>> {
        let f = self.open_existing(name)?;
        chunker::bounded::read_up_to(&f, max)?.ok_or_else(|| {
            os_error(
                "read",
                f.path(),
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("longer than {max} bytes"),
                ),
            )
        })
    }

    /// Replace `name` with `data` durably: a new temporary, fsync, rename, fsync the directory.
    pub fn write_atomic(&self, name: &str, data: &[u8]) -> io::Result<()> {
        static N: AtomicU64 = AtomicU64::new(0);
        let tmp = format!(
            "{NEW_PREFIX}{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut f = self.create_new(&tmp)?;
        let res = f
            .write_all(data)
            .and_then(|()| f.sync_all())
            .and_then(|()| self.rename_within(&tmp, name))
            .and_then(|()| self.sync());
        if res.is_err() {
            let _ = self.remove(&tmp);
        }
        res
    }

    fn rename_within(&self, from: &str, to: &str) -> io::Result<()> {
        let fail = |e| os_error("rename", &self.join(from), e);
        let (a, b) = (plain(from).map_err(fail)?, plain(to).map_err(fail)?);
        rustix::fs::renameat(&self.fd, a, &self.fd, b).map_err(|e| fail(e.into()))
    }

    /// Move `name` to `dest` (outside the staging directory, same filesystem). The rename
    /// replaces whatever is at `dest` (a symlink included) without following it.
    pub fn rename_out(&self, name: &str, dest: &Path) -> io::Result<()> {
        let fail = |e| os_error("rename into place", dest, e);
        let a = plain(name).map_err(fail)?;
        rustix::fs::renameat(&self.fd, a, CWD, dest).map_err(|e| fail(e.into()))
    }

    /// Whether `name` in the directory is still the very file `file` is open on (same device and
    /// inode, a regular file, not a symlink): checked right before an install's rename, so that
    /// bytes someone swapped in under our name are never installed.
    pub fn still_is(&self, name: &str, file: &File) -> io::Result<bool> {
        let fail = |e| os_error("query metadata", &self.join(name), e);
        let name = plain(name).map_err(fail)?;
        let at = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fail(e.into()))?;
        let open = fstat(file).map_err(|e| fail(e.into()))?;
        Ok(is_regular(&at) && at.st_dev == open.st_dev && at.st_ino == open.st_ino)
    }

    /// Unlink `name` (never following it); absent is fine.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let fail = |e| os_error("remove file", &self.join(name), e);
        let name = plain(name).map_err(fail)?;
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(fail(e.into())),
        }
    }

    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(&self.fd).map_err(|e| os_error("sync directory", &self.path, e.into()))
    }

    /// Names in the directory with their age (by modification time, never following a link).
    fn entries(&self) -> io::Result<Vec<(String, Duration)>> {
        let now = SystemTime::now();
        let mut out = Vec::new();
        for e in fs::read_dir(&self.path)? {
            let e = e?;
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let age = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default();
            out.push((name, age));
        }
        Ok(out)
    }

    /// Remove what [`stale_entries`] calls stale, keeping `current` (the names of the download
    /// about to run). Failures are ignored: this is housekeeping.
    pub fn clean(&self, current: &[&str], local_name: &str) {
        if let Ok(entries) = self.entries() {
            for name in stale_entries(&entries, current, local_name) {
                let _ = self.remove(&name);
            }
            let _ = self.sync();
        }
    }
}

fn is_regular(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
}

/// The staging names of an artifact: data `<sha16>-<local_name>`, its record `<...>.state`.
pub(crate) fn staging_names(sha_hex: &str, local_name: &str) -> (String, String) {
    let data = format!("{}-{local_name}", &sha_hex[..16.min(sha_hex.len())]);
    let state = format!("{data}.state");
    (data, state)
}

/// `(sha16, local name)` of a name of the staging files' shape `<sha16>-<local name>[.state]`.
pub(crate) fn staged_parts(name: &str) -> Option<(&str, &str)> {
    let base = name.strip_suffix(".state").unwrap_or(name);
    base.split_once('-').filter(|(sha, _)| sha.len() == 16)
}

/// Which staging entries to remove before a download of `local_name` whose own names are
/// `current` (kept): another digest's files of the same model at once (never resumable into
/// this artifact), anything else once untouched for [`STALE_AFTER`]. Pure.
pub(crate) fn stale_entries(
    entries: &[(String, Duration)],
    current: &[&str],
    local_name: &str,
) -> Vec<String> {
    let same_model = |n: &str| staged_parts(n).is_some_and(|(_, rest)| rest == local_name);
    entries
        .iter()
        .filter(|(n, age)| !current.contains(&n.as_str()) && (same_model(n) || *age >= STALE_AFTER))
        .map(|(n, _)| n.clone())
        .collect()
}

/// An artifact a plan may still download: its local name, and the SHA-256 the catalog declares
/// for it (`None`: the digest comes from the origin's `.sha256` at download time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usable<'a> {
    /// The artifact's local file name.
    pub local_name: &'a str,
    /// Its declared SHA-256 in hex, or `None` when the digest comes from the origin.
    pub sha256_hex: Option<&'a str>,
}

/// Which entries of the staging directory no download can use, for `gc`. Pure: a table decides.
/// A staging file or record (`<sha16>-<local_name>[.state]`) is usable when `usable` names its
/// artifact with the same digest prefix, or with no declared digest; any other one of that shape
/// is removed. Names of another shape (a temporary of an interrupted write) are left to the age
/// rule ([`STALE_AFTER`]).
pub fn unusable_staged(entries: &[String], usable: &[Usable<'_>]) -> Vec<String> {
    entries
        .iter()
        .filter(|n| {
            let Some((sha, local)) = staged_parts(n) else {
                return false;
            };
            if !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return false;
            }
            !usable.iter().any(|u| {
                u.local_name == local && u.sha256_hex.is_none_or(|h| h.get(..16) == Some(sha))
            })
        })
        .cloned()
        .collect()
}

/// Bytes the staging file of an artifact (`sha256_hex`, `local_name`) holds on disk in
/// `models_dir`'s staging directory: what its download reuses or frees before the space check,
/// so a dry run counts them as free too. 0 when there is none (nothing is created or followed).
pub fn staged_bytes(models_dir: &Path, sha256_hex: &str, local_name: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let (data, _) = staging_names(sha256_hex, local_name);
    match std::fs::symlink_metadata(models_dir.join(STAGING_DIR).join(data)) {
        Ok(m) if m.is_file() => m.blocks().saturating_mul(512),
        _ => 0,
    }
}

/// `gc` of the staging directory of `models_dir`: the entries [`unusable_staged`] names,
/// removed unless `dry_run`; returns them. A models directory without a staging directory has
/// none (nothing is created). Never follows a link (the directory is opened as for a download).
pub fn collect_unusable(
    models_dir: &Path,
    usable: &[Usable<'_>],
    dry_run: bool,
) -> io::Result<Vec<String>> {
    match std::fs::symlink_metadata(models_dir.join(STAGING_DIR)) {
        Ok(m) if m.is_dir() => {}
        _ => return Ok(Vec::new()),
    }
    let dir = StagingDir::open(models_dir)?;
    let names: Vec<String> = dir.entries()?.into_iter().map(|(n, _)| n).collect();
    let unusable = unusable_staged(&names, usable);
    if !dry_run {
        for name in &unusable {
            dir.remove(name)?;
        }
        dir.sync()?;
    }
    Ok(unusable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The blocks a staged file holds count for its artifact; a link or nothing counts 0.
    #[test]
    fn staged_bytes_of_an_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let sha = "ab".repeat(32);
        assert_eq!(staged_bytes(dir.path(), &sha, "a_driving_tinygrad.pkl"), 0);
        let staging = dir.path().join(STAGING_DIR);
        fs::create_dir_all(&staging).unwrap();
        let (data, _) = staging_names(&sha, "a_driving_tinygrad.pkl");
        fs::write(staging.join(&data), vec![7u8; 64 * 1024]).unwrap();
        assert!(staged_bytes(dir.path(), &sha, "a_driving_tinygrad.pkl") >= 64 * 1024);
        assert_eq!(
            staged_bytes(dir.path(), &"cd".repeat(32), "a_driving_tinygrad.pkl"),
            0
        );
        let (other, _) = staging_names(&sha, "b_driving_tinygrad.pkl");
        std::os::unix::fs::symlink(staging.join(&data), staging.join(other)).unwrap();
        assert_eq!(staged_bytes(dir.path(), &sha, "b_driving_tinygrad.pkl"), 0);
    }

    /// `gc`'s rule: a staged file or record of an artifact no plan can use (another digest, a
    /// model gone from the catalog) goes; one a download may resume stays; names of another
    /// shape are left to the age rule.
    #[test]
    fn unusable_rule() {
        let sha = "0123456789abcdef".repeat(4);
        let other = "fedcba9876543210".repeat(4);
        let (data, state) = staging_names(&sha, "a_driving_tinygrad.pkl");
        let (old, old_state) = staging_names(&other, "a_driving_tinygrad.pkl");
        let (gone, _) = staging_names(&sha, "z_driving_tinygrad.pkl");
        let (b, _) = staging_names(&other, "b_driving_tinygrad.pkl");
        let a = |h: Option<&'static str>| Usable {
            local_name: "a_driving_tinygrad.pkl",
            sha256_hex: h,
        };
        let b_any = Usable {
            local_name: "b_driving_tinygrad.pkl",
            sha256_hex: None,
        };
        let all = vec![
            data.clone(),
            state.clone(),
            old.clone(),
            old_state.clone(),
            gone.clone(),
            b.clone(),
            ".new-1-x".to_string(),
            "junk".to_string(),
        ];
        let sha_static: &'static str = Box::leak(sha.into_boxed_str());
        for (usable, want) in [
            (
                vec![a(Some(sha_static)), b_any.clone()],
                vec![old.clone(), old_state.clone(), gone.clone()],
            ),
            // No declared digest: any digest of that artifact may be resumed.
            (vec![a(None)], vec![gone.clone(), b.clone()]),
            (
                vec![],
                vec![data.clone(), state.clone(), old, old_state, gone, b],
            ),
        ] {
            assert_eq!(unusable_staged(&all, &usable), want, "{usable:?}");
        }
    }

    #[test]
    fn stale_rule() {
        let day = Duration::from_secs(24 * 3600);
        let (data, state) = staging_names("0123456789abcdef00", "a_driving_tinygrad.pkl");
        assert_eq!(data, "0123456789abcdef-a_driving_tinygrad.pkl");
        let e = |n: &str, age: Duration| (n.to_string(), age);
        let entries = [
            e(&data, 30 * day),
            e(&state, 30 * day),
            e("ffffffffffffffff-a_driving_tinygrad.pkl", Duration::ZERO),
            e(
                "ffffffffffffffff-a_driving_tinygrad.pkl.state",
                Duration::ZERO,
            ),
            e("1111111111111111-b_driving_tinygrad.pkl", day),
            e("2222222222222222-b_driving_tinygrad.pkl", 8 * day),
            e(".new-12-0-x.state", 8 * day),
            e(".new-12-1-y.state", Duration::ZERO),
            e("stranger", 8 * day),
        ];
        let got = stale_entries(&entries, &[&data, &state], "a_driving_tinygrad.pkl");
        assert_eq!(
            got,
            [
                "ffffffffffffffff-a_driving_tinygrad.pkl",
                "ffffffffffffffff-a_driving_tinygrad.pkl.state",
                "2222222222222222-b_driving_tinygrad.pkl",
                ".new-12-0-x.state",
                "stranger",
            ]
        );
    }

    /// File errors of the staging directory's raw system calls name the operation and the
    /// path, like fs-err's, and keep their kind.
    #[test]
    fn staging_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let s = StagingDir::open(dir.path()).unwrap();
        let e = s.read_small("missing.state", 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let want = dir.path().join(STAGING_DIR).join("missing.state");
        assert!(
            e.to_string()
                .starts_with(&format!("failed to open file `{}`: ", want.display())),
            "{e}"
        );
        let e = crate::Error::from(e);
        assert!(
            e.is_local(),
            "a device-side error: no other origin is tried"
        );

        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"x").unwrap();
        let Err(e) = StagingDir::open(&not_a_dir) else {
            panic!("a file cannot hold the staging directory")
        };
        assert!(
            e.to_string().contains(&not_a_dir.display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn a_planted_symlink_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        std::fs::create_dir(&models).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("victim"), b"precious").unwrap();

        // The directory's own name is a symlink to a directory elsewhere.
        std::os::unix::fs::symlink(&outside, models.join(STAGING_DIR)).unwrap();
        let s = StagingDir::open(&models).unwrap();
        let meta = std::fs::symlink_metadata(models.join(STAGING_DIR)).unwrap();
        assert!(meta.is_dir(), "replaced by a real directory");
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"precious");

        // A symlink at a staging name inside: opening it is refused, creating replaces it.
        std::os::unix::fs::symlink(outside.join("victim"), s.join("x")).unwrap();
        let refused = s.open_existing("x").unwrap_err().to_string();
        assert!(
            refused.ends_with(&format!("(os error {})", libc::ELOOP)),
            "{refused}"
        );
        assert!(s.read_small("x", 100).is_err());
        let mut f = s.create_new("x").unwrap();
        f.write_all(b"model bytes").unwrap();
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"precious");
        s.write_atomic("y", b"state").unwrap();
        assert_eq!(s.read_small("y", 5).unwrap(), b"state");
        assert!(s.read_small("y", 4).is_err(), "size cap");

        // A loose mode is tightened; a file at the name is replaced by the directory.
        drop(s);
        std::fs::set_permissions(
            models.join(STAGING_DIR),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        StagingDir::open(&models).unwrap();
        let mode = std::fs::metadata(models.join(STAGING_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::remove_dir_all(models.join(STAGING_DIR)).unwrap();
        std::fs::write(models.join(STAGING_DIR), b"file").unwrap();
        StagingDir::open(&models).unwrap();
        assert!(models.join(STAGING_DIR).is_dir());

        // The previous build's staging files in the models dir are cleaned up.
        std::fs::write(
            models.join(".tmp-partial-0123-a_driving_tinygrad.pkl"),
            b"old",
        )
        .unwrap();
        StagingDir::open(&models).unwrap();
        assert!(
            !models
                .join(".tmp-partial-0123-a_driving_tinygrad.pkl")
                .exists()
        );
    }
}
