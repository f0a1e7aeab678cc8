use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use chunker::{
    Error, Expected, Resolved, Sha256Digest, SplitOptions, chunk_manifest_name, chunk_name,
    legacy_part_name, sidecar_name, split_file, split_reader,
};
use proptest::prelude::*;

const NAME: &str = "pop223_driving_tinygrad.pkl";

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn split_bytes(dir: &Path, data: &[u8], chunk_size: u64) -> chunker::Result<chunker::SplitReport> {
    split_reader(
        data,
        data.len() as u64,
        NAME,
        dir,
        &SplitOptions { chunk_size },
    )
}

/// A split in 5-byte chunks of `reader`, declared to be `size` bytes, that must fail.
fn split_5_err(reader: impl Read, size: u64, dir: &Path) -> Error {
    split_reader(reader, size, NAME, dir, &SplitOptions { chunk_size: 5 }).unwrap_err()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn split_writes_the_fleet_format() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload(20, 1);
    let report = split_bytes(dir.path(), &data, 7).unwrap();
    assert_eq!(report.chunk_count, 3);
    assert_eq!(report.size, 20);
    assert_eq!(report.sha256, Sha256Digest::of_bytes(&data));
    assert_eq!(
        names_in(dir.path()),
        vec![
            format!("{NAME}.chunk01of03"),
            format!("{NAME}.chunk02of03"),
            format!("{NAME}.chunk03of03"),
            format!("{NAME}.chunkmanifest"),
            format!("{NAME}.sha256"),
        ]
    );
    let m = fs::read(dir.path().join(chunk_manifest_name(NAME))).unwrap();
    assert_eq!(m, b"3", "no newline in the chunk manifest");
    let sidecar = fs::read_to_string(dir.path().join(sidecar_name(NAME))).unwrap();
    assert_eq!(sidecar, format!("{}  {NAME}\n", report.sha256));
    let sizes: Vec<u64> = report.chunks.iter().map(|c| c.size).collect();
    assert_eq!(sizes, vec![7, 7, 6]);
    assert_eq!(
        report.chunks[1].sha256,
        Sha256Digest::of_bytes(&data[7..14])
    );
    assert_eq!(
        fs::read(dir.path().join(chunk_name(NAME, 3, 3))).unwrap(),
        &data[14..]
    );
}

#[test]
fn one_chunk_is_still_a_chunk_set() {
    let dir = tempfile::tempdir().unwrap();
    let report = split_bytes(dir.path(), b"small", 1 << 20).unwrap();
    assert_eq!(report.chunk_count, 1);
    assert!(dir.path().join(format!("{NAME}.chunk01of01")).exists());
}

#[test]
fn empty_input_and_too_many_chunks_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        split_bytes(dir.path(), b"", 7),
        Err(Error::EmptyInput { .. })
    ));
    let err = split_bytes(dir.path(), &payload(100, 0), 1).unwrap_err();
    assert!(
        matches!(err, Error::TooManyChunks { needed: 100, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("--chunk-size"), "{err}");
    assert!(split_bytes(dir.path(), &payload(99, 0), 1).is_ok());
    assert!(matches!(
        split_bytes(dir.path(), b"x", 0),
        Err(Error::ZeroChunkSize)
    ));
}

/// A reader that fails after `ok` bytes, like a disk error or a yanked USB drive.
struct FailingReader {
    data: Vec<u8>,
    pos: usize,
    ok: usize,
}

impl Read for FailingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.ok {
            return Err(io::Error::other("injected read failure"));
        }
        let n = buf.len().min(self.ok - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn a_failed_split_leaves_the_previous_set_intact_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let old = payload(30, 7);
    split_bytes(dir.path(), &old, 10).unwrap();
    let before = names_in(dir.path());

    let new = payload(50, 9);
    let reader = FailingReader {
        data: new.clone(),
        pos: 0,
        ok: 25,
    };
    let err = split_reader(
        reader,
        50,
        NAME,
        dir.path(),
        &SplitOptions { chunk_size: 10 },
    )
    .unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    assert_eq!(
        names_in(dir.path()),
        before,
        "no temporaries, no new chunks"
    );
    let logical = dir.path().join(NAME);
    let mut back = Vec::new();
    chunker::open(&logical)
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, old);
}

#[test]
fn a_shorter_input_than_declared_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload(10, 0);
    let err = split_5_err(&data[..], 12, dir.path());
    assert!(
        matches!(
            err,
            Error::InputChanged {
                expected: 12,
                actual: 10,
                ..
            }
        ),
        "{err}"
    );
    let err = split_5_err(&data[..], 8, dir.path());
    assert!(
        matches!(
            err,
            Error::InputChanged {
                expected: 8,
                actual: 9,
                ..
            }
        ),
        "{err}"
    );
    assert!(names_in(dir.path()).is_empty());
}

#[test]
fn naming_input_names_the_file_a_failed_stream_came_from() {
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("model.pkl");
    let err = split_5_err(Failing, 10, dir.path()).naming_input(&src);
    assert!(
        matches!(&err, Error::ReadInput { path, .. } if *path == src),
        "{err}"
    );
    let err = split_5_err(&[0u8; 3][..], 4, dir.path()).naming_input(&src);
    assert!(
        matches!(&err, Error::InputChanged { path, .. } if *path == src),
        "{err}"
    );
    assert!(names_in(dir.path()).is_empty());
}

#[test]
fn resplitting_with_another_count_removes_stale_chunks() {
    let dir = tempfile::tempdir().unwrap();
    split_bytes(dir.path(), &payload(30, 1), 10).unwrap();
    split_bytes(dir.path(), &payload(30, 2), 15).unwrap();
    assert!(!dir.path().join(chunk_name(NAME, 3, 3)).exists());
    assert!(dir.path().join(chunk_name(NAME, 2, 2)).exists());
}

#[test]
fn split_file_names_the_set_after_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(NAME);
    let data = payload(1000, 3);
    fs::write(&src, &data).unwrap();
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    let report = split_file(&src, &out, &SplitOptions { chunk_size: 300 }).unwrap();
    assert_eq!(report.name, NAME);
    assert_eq!(report.chunk_count, 4);
    let joined = dir.path().join("joined");
    let (digest, size) = chunker::join(&out.join(NAME), &joined).unwrap();
    assert_eq!((digest, size), (report.sha256, 1000));
    assert_eq!(fs::read(&joined).unwrap(), data);
}

#[test]
fn resolution_rules() {
    let dir = tempfile::tempdir().unwrap();
    let logical = dir.path().join(NAME);
    assert_eq!(chunker::resolve(&logical).unwrap(), None);
    assert!(matches!(
        chunker::open(&logical),
        Err(Error::NotFound { .. })
    ));

    split_bytes(dir.path(), &payload(20, 0), 7).unwrap();
    assert!(matches!(
        chunker::resolve(&logical).unwrap(),
        Some(Resolved::Chunked { .. })
    ));

    // An incomplete set is not present; the strict readers name the missing chunk.
    let second = dir.path().join(chunk_name(NAME, 2, 3));
    fs::rename(&second, dir.path().join("aside")).unwrap();
    assert_eq!(chunker::resolve(&logical).unwrap(), None);
    match chunker::open(&logical) {
        Err(Error::MissingChunk {
            index: 2,
            count: 3,
            path,
        }) => assert_eq!(path, second),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("opened an incomplete set"),
    }
    fs::rename(dir.path().join("aside"), &second).unwrap();

    // A plain file wins over the chunk set.
    fs::write(&logical, b"plain").unwrap();
    assert!(matches!(
        chunker::resolve(&logical).unwrap(),
        Some(Resolved::Plain { size: 5, .. })
    ));
    let mut s = String::new();
    chunker::open(&logical)
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "plain");
}

#[test]
fn malformed_chunk_manifest_is_quoted() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(chunk_manifest_name(NAME)), "two\n").unwrap();
    let err = chunker::resolve(&dir.path().join(NAME)).unwrap_err();
    assert!(err.to_string().contains("\"two\\n\""), "{err}");
}

fn write_legacy(dir: &Path, data: &[u8], part: usize) -> PathBuf {
    for (i, piece) in data.chunks(part).enumerate() {
        fs::write(dir.join(legacy_part_name(NAME, i as u32)), piece).unwrap();
    }
    fs::write(
        dir.join(sidecar_name(NAME)),
        chunker::format_sidecar(&Sha256Digest::of_bytes(data), NAME),
    )
    .unwrap();
    dir.join(NAME)
}

#[test]
fn legacy_parts_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload(25, 5);
    let logical = write_legacy(dir.path(), &data, 10);
    let resolved = chunker::resolve(&logical).unwrap().unwrap();
    assert_eq!(resolved.form(), "legacy");
    assert_eq!(resolved.chunk_count(), 3);
    let report = chunker::verify(&logical, &Expected::default()).unwrap();
    assert_eq!(report.sha256, Sha256Digest::of_bytes(&data));
    let out = dir.path().join("joined.pkl");
    chunker::join(&logical, &out).unwrap();
    assert_eq!(fs::read(&out).unwrap(), data);

    // A corrupt part is caught against the sidecar, and join writes nothing.
    fs::write(dir.path().join(legacy_part_name(NAME, 1)), b"XXXXXXXXXX").unwrap();
    let out2 = dir.path().join("joined2.pkl");
    assert!(matches!(
        chunker::join(&logical, &out2),
        Err(Error::DigestMismatch { .. })
    ));
    assert!(!out2.exists());
    assert!(matches!(
        chunker::verify(&logical, &Expected::default()),
        Err(Error::DigestMismatch { .. })
    ));
}

#[test]
fn legacy_parts_without_sidecar_are_not_present() {
    let dir = tempfile::tempdir().unwrap();
    let logical = write_legacy(dir.path(), b"abcdef", 4);
    fs::remove_file(dir.path().join(sidecar_name(NAME))).unwrap();
    assert_eq!(chunker::resolve(&logical).unwrap(), None);
}

#[test]
fn verify_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload(20, 0);
    let report = split_bytes(dir.path(), &data, 7).unwrap();
    let logical = dir.path().join(NAME);
    let chunk_digests: Vec<_> = report.chunks.iter().map(|c| c.sha256).collect();
    let good = Expected {
        sha256: Some(report.sha256),
        size: Some(20),
        chunk_count: Some(3),
        chunk_sha256: Some(chunk_digests.clone()),
        ..Expected::default()
    };
    let ok = chunker::verify(&logical, &good).unwrap();
    assert_eq!(ok.chunks[2].sha256, Some(chunk_digests[2]));

    let e = chunker::verify(
        &logical,
        &Expected {
            chunk_count: Some(2),
            ..good.clone()
        },
    );
    assert!(matches!(
        e,
        Err(Error::CountMismatch {
            expected: 2,
            actual: 3,
            ..
        })
    ));
    let e = chunker::verify(
        &logical,
        &Expected {
            size: Some(21),
            ..good.clone()
        },
    );
    assert!(matches!(
        e,
        Err(Error::SizeMismatch {
            expected: 21,
            actual: 20,
            ..
        })
    ));

    // Same-size corruption of chunk 2: the per-chunk digests name it.
    let c2 = dir.path().join(chunk_name(NAME, 2, 3));
    fs::write(&c2, b"XXXXXXX").unwrap();
    match chunker::verify(&logical, &good) {
        Err(Error::DigestMismatch {
            what,
            expected,
            actual,
        }) => {
            assert!(what.starts_with("chunk 2 of 3"), "{what}");
            assert_eq!(expected, chunk_digests[1]);
            assert_eq!(actual, Sha256Digest::of_bytes(b"XXXXXXX"));
        }
        other => panic!("{other:?}"),
    }
    // Without per-chunk digests the whole digest still catches it.
    let e = chunker::verify(
        &logical,
        &Expected {
            chunk_sha256: None,
            ..good.clone()
        },
    );
    assert!(matches!(e, Err(Error::DigestMismatch { .. })));

    // A truncated middle chunk is named by size before any hashing.
    fs::write(&c2, b"XX").unwrap();
    match chunker::verify(&logical, &Expected::default()) {
        Err(Error::SizeMismatch {
            what,
            expected: 7,
            actual: 2,
        }) => {
            assert!(what.starts_with("chunk 2 of 3"), "{what}")
        }
        other => panic!("{other:?}"),
    }
}

/// Regression: a truncated first chunk was reported as "chunk 2 of 3 ... expected 100" because
/// the first chunk's size was taken as the chunk size, blaming every good chunk after it.
/// (artifact size, chunk replaced, chunk count, its new bytes, expected size if checked,
/// actual size); chunk size 10 throughout.
type BadChunkCase = (usize, u32, u32, &'static [u8], Option<u64>, u64);

#[test]
fn verify_names_a_truncated_first_chunk() {
    let cases: [BadChunkCase; 4] = [
        (25, 1, 3, b"xyz", Some(10), 3),
        // Two chunks: a first chunk shorter than the last one is named too.
        (18, 1, 2, b"xyz", Some(8), 3),
        // An empty or oversized last chunk is still the last chunk's fault.
        (25, 3, 3, b"", None, 0),
        (25, 3, 3, &[0u8; 11], Some(10), 11),
    ];
    for (i, (size, index, count, bytes, want_expected, want_actual)) in
        cases.into_iter().enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        split_bytes(dir.path(), &payload(size, i as u8 + 1), 10).unwrap();
        fs::write(dir.path().join(chunk_name(NAME, index, count)), bytes).unwrap();
        match chunker::verify(&dir.path().join(NAME), &Expected::default()) {
            Err(Error::SizeMismatch {
                what,
                expected,
                actual,
            }) => {
                assert!(
                    what.starts_with(&format!("chunk {index} of {count}")),
                    "{what}"
                );
                assert_eq!(actual, want_actual, "case {i}");
                if let Some(e) = want_expected {
                    assert_eq!(expected, e, "case {i}");
                }
            }
            other => panic!("case {i}: {other:?}"),
        }
    }
}

#[test]
fn reader_seeks_across_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload(50, 4);
    split_bytes(dir.path(), &data, 8).unwrap();
    let mut r = chunker::open(&dir.path().join(NAME)).unwrap();
    assert_eq!(r.len(), 50);
    let mut buf = [0u8; 9];
    r.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, &data[..9]);
    r.seek(SeekFrom::Start(30)).unwrap();
    r.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, &data[30..39]);
    r.seek(SeekFrom::End(-5)).unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, &data[45..]);
    r.seek(SeekFrom::Current(-20)).unwrap();
    r.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, &data[30..39]);
    assert!(r.seek(SeekFrom::Current(-100)).is_err());
    r.seek(SeekFrom::Start(500)).unwrap();
    assert_eq!(r.read(&mut buf).unwrap(), 0);
}

#[test]
fn a_chunk_truncated_after_resolution_is_an_error_not_short_data() {
    let dir = tempfile::tempdir().unwrap();
    split_bytes(dir.path(), &payload(30, 4), 10).unwrap();
    let mut r = chunker::open(&dir.path().join(NAME)).unwrap();
    fs::write(dir.path().join(chunk_name(NAME, 2, 3)), b"short").unwrap();
    let mut out = Vec::new();
    let err = r.read_to_end(&mut out).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    assert!(err.to_string().contains("chunk02of03"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Split then join is the identity, for any size and chunk size giving 1..=99 chunks,
    /// including 1-byte chunks and exact multiples.
    #[test]
    fn split_then_join_is_identity(
        chunk_size in 1u64..4096,
        count in 1u64..=99,
        tail in 0u64..4096,
        seed in any::<u8>(),
    ) {
        // size in ((count-1)*chunk, count*chunk]; tail == 0 gives an exact multiple.
        let size = (count - 1) * chunk_size + 1 + tail % chunk_size;
        let data = payload(size as usize, seed);
        let dir = tempfile::tempdir().unwrap();
        let report = split_bytes(dir.path(), &data, chunk_size).unwrap();
        prop_assert_eq!(u64::from(report.chunk_count), count);
        let out = dir.path().join("joined");
        let (digest, joined_size) = chunker::join(&dir.path().join(NAME), &out).unwrap();
        prop_assert_eq!(joined_size, size);
        prop_assert_eq!(digest, Sha256Digest::of_bytes(&data));
        prop_assert_eq!(fs::read(&out).unwrap(), data);
        let v = chunker::verify(&dir.path().join(NAME), &Expected {
            sha256: Some(report.sha256),
            size: Some(size),
            chunk_count: Some(report.chunk_count),
            chunk_sha256: Some(report.chunks.iter().map(|c| c.sha256).collect()),
            ..Expected::default()
        });
        prop_assert!(v.is_ok());
    }

    #[test]
    fn more_than_99_chunks_is_refused(chunk_size in 1u64..64, extra in 1u64..1000) {
        let size = 99 * chunk_size + extra;
        let dir = tempfile::tempdir().unwrap();
        let data = payload(size as usize, 0);
        let is_too_many = matches!(split_bytes(dir.path(), &data, chunk_size), Err(Error::TooManyChunks { .. }));
        prop_assert!(is_too_many);
        prop_assert!(names_in(dir.path()).is_empty());
    }
}

#[test]
fn join_and_verify_report_progress_up_to_the_artifact_size() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload(5000, 8);
    let report = split_bytes(dir.path(), &data, 1024).unwrap();
    let logical = dir.path().join(NAME);
    let mut seen = 0u64;
    chunker::join_checked(&logical, &dir.path().join("out"), None, &mut |n| seen += n).unwrap();
    assert_eq!(seen, 5000);
    for per_chunk in [None, Some(report.chunks.iter().map(|c| c.sha256).collect())] {
        let mut seen = 0u64;
        let expected = Expected {
            chunk_sha256: per_chunk,
            ..Expected::default()
        };
        chunker::verify_with_progress(&logical, &expected, &mut |n| seen += n).unwrap();
        assert_eq!(seen, 5000);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Aligned chunk sizes take the O_DIRECT write path (where the filesystem has it): chunks
    /// start inside and across the 1 MiB pool buffers, and the artifact's tail is unaligned.
    #[test]
    fn aligned_chunk_sizes_split_then_join_is_identity(
        pages in 1u64..600,
        size in 1usize..(3 << 20),
        seed in any::<u8>(),
    ) {
        let chunk_size = pages * 4096;
        prop_assume!(chunker::chunk_count_for(size as u64, chunk_size) <= 99);
        let data = payload(size, seed);
        let dir = tempfile::tempdir().unwrap();
        let report = split_bytes(dir.path(), &data, chunk_size).unwrap();
        for (i, c) in report.chunks.iter().enumerate() {
            let start = i * chunk_size as usize;
            let end = (start + chunk_size as usize).min(size);
            prop_assert_eq!(c.sha256, Sha256Digest::of_bytes(&data[start..end]));
        }
        let out = dir.path().join("joined");
        chunker::join(&dir.path().join(NAME), &out).unwrap();
        prop_assert_eq!(fs::read(&out).unwrap(), data);
    }
}

#[test]
fn direct_writes_fall_back_for_unaligned_pieces_on_any_filesystem() {
    use chunker::atomic::{AtomicFile, DIRECT_ALIGN};
    let shm = Path::new("/dev/shm");
    let mut dirs = vec![tempfile::tempdir().unwrap()];
    if shm.is_dir() {
        dirs.push(tempfile::tempdir_in(shm).unwrap());
    }
    for dir in &dirs {
        let dest = dir.path().join("x.bin");
        let mut f = AtomicFile::create_direct(&dest).unwrap();
        // An aligned page, then an unaligned tail from an unaligned address.
        let mut page = vec![0u8; 3 * DIRECT_ALIGN];
        let off = page.as_ptr().align_offset(DIRECT_ALIGN);
        page[off..off + DIRECT_ALIGN].fill(7);
        f.write_piece(&page[off..off + DIRECT_ALIGN]).unwrap();
        f.write_piece(b"tail bytes").unwrap();
        f.write_piece(&page[off..off + DIRECT_ALIGN]).unwrap();
        f.commit_and_sync_dir().unwrap();
        let back = fs::read(&dest).unwrap();
        let mut want = vec![7u8; DIRECT_ALIGN];
        want.extend_from_slice(b"tail bytes");
        want.extend_from_slice(&[7u8; DIRECT_ALIGN]);
        assert_eq!(back, want, "{}", dir.path().display());
    }
}

#[test]
fn file_errors_name_the_path_and_keep_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model.pkl");
    let err = split_file(&missing, dir.path(), &SplitOptions { chunk_size: 5 }).unwrap_err();
    assert!(
        matches!(&err, Error::Io(e) if e.kind() == io::ErrorKind::NotFound),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&*missing.to_string_lossy()),
        "{err}"
    );

    let out = dir.path().join("no-such-dir").join("joined.pkl");
    let err = chunker::atomic::write_atomic(&out, b"x").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains("no-such-dir"), "{err}");
}

#[test]
fn plan_split_names_what_the_split_then_writes_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    split_bytes(dir.path(), &payload(30, 1), 10).unwrap();
    let stale = format!(".tmp-{}-0-{}", u32::MAX, chunk_name(NAME, 1, 2));
    fs::write(dir.path().join(&stale), b"half").unwrap();
    let before = names_in(dir.path());
    let opts = SplitOptions { chunk_size: 16 };
    let plan = chunker::plan_split(NAME, 30, dir.path(), &opts).unwrap();
    assert_eq!(names_in(dir.path()), before, "planning wrote something");
    assert_eq!(plan.chunk_count, 2);
    let sizes: Vec<u64> = plan.chunks.iter().map(|c| c.size).collect();
    assert_eq!(sizes, [16, 14]);
    let mut removed: Vec<String> = (1..=3).map(|i| chunk_name(NAME, i, 3)).collect();
    removed.push(stale);
    removed.sort();
    assert_eq!(plan.removed, removed);

    split_bytes(dir.path(), &payload(30, 2), 16).unwrap();
    let mut expected = plan.written.clone();
    expected.sort();
    assert_eq!(names_in(dir.path()), expected);
    assert!(matches!(
        chunker::plan_split(NAME, 0, dir.path(), &opts),
        Err(Error::EmptyInput { .. })
    ));
}

/// Issue 37: `verify` with default expectations checks a set against its own `.sha256`, as
/// `release-cli chunk verify` does: same-size corruption of a chunk (counts and sizes intact) is
/// an error naming the sidecar, not `Ok`. Without a sidecar, or told to ignore it, the report
/// says no digest was compared; a malformed sidecar is an error naming it.
#[test]
fn default_expectations_check_the_sets_own_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload(20, 3);
    let report = split_bytes(dir.path(), &data, 7).unwrap();
    let logical = dir.path().join(NAME);
    let sidecar = dir.path().join(sidecar_name(NAME));
    assert!(sidecar.is_file(), "split writes the sidecar");
    let ok = chunker::verify(&logical, &Expected::default()).unwrap();
    assert_eq!(ok.digest_checked, chunker::DigestChecked::OwnSidecar);
    assert_eq!(ok.sha256, report.sha256);

    fs::write(dir.path().join(chunk_name(NAME, 2, 3)), b"XXXXXXX").unwrap();
    match chunker::verify(&logical, &Expected::default()) {
        Err(Error::DigestMismatch {
            what,
            expected,
            actual,
        }) => {
            assert!(what.contains(&sidecar.display().to_string()), "{what}");
            assert_eq!(expected, report.sha256);
            assert_ne!(actual, report.sha256);
        }
        other => panic!("a set whose bytes no longer match its .sha256 verified: {other:?}"),
    }
    // Ignoring the sidecar is a choice the report makes visible.
    let ignored = Expected {
        own_sidecar: chunker::OwnSidecar::Ignore,
        ..Expected::default()
    };
    let r = chunker::verify(&logical, &ignored).unwrap();
    assert_eq!(r.digest_checked, chunker::DigestChecked::Nothing);
    // An expected digest wins over the sidecar.
    let r = chunker::verify(
        &logical,
        &Expected {
            sha256: Some(r.sha256),
            ..Expected::default()
        },
    )
    .unwrap();
    assert_eq!(r.digest_checked, chunker::DigestChecked::Expected);
    // A malformed sidecar is an error naming it, never taken as "no sidecar".
    fs::write(&sidecar, b"not a digest\n").unwrap();
    let e = chunker::verify(&logical, &Expected::default()).unwrap_err();
    assert!(
        e.to_string().contains(&sidecar.display().to_string()),
        "{e}"
    );
    // No sidecar: the bytes hash, and the report says nothing was compared.
    fs::remove_file(&sidecar).unwrap();
    let r = chunker::verify(&logical, &Expected::default()).unwrap();
    assert_eq!(r.digest_checked, chunker::DigestChecked::Nothing);
}
