//! Bytes moved within a file while a store writes it, as each backend learns them, and the pure
//! parsers that read them from the tools' own progress output.
//!
//! What the numbers mean depends on who counted them ([`Measure`]):
//! - a directory store counts the bytes it has copied into the file (exact);
//! - a Hugging Face store reads the `hf` CLI's own per-file progress line (hf-xet's count of the
//!   file's bytes done, printed to three significant digits in decimal units);
//! - a `github:` store commits each file locally and reports the bytes of each `git push
//!   --progress` ("Writing objects: …, 47.09 MiB | …"), the pack bytes written to the remote for
//!   the batch of commits that push carries.
//!
//! Nothing is interpolated: a backend that reports nothing within a file says so
//! ([`Measure::AtEnd`]) and its bar moves when the file is done.

use serde::Serialize;

/// Who counted a byte report, and so what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// Bytes copied into the store's file so far (a directory store): exact.
    Copied,
    /// The file's bytes hf-xet reports done, as the `hf` CLI prints them on the file's own
    /// progress line: three significant digits in decimal units, so `12.1MB` is read as
    /// 12,100,000 (within half a unit of the last digit; the last line may round past the size,
    /// which is capped). The figure follows the upload: over a slow uplink it grows with the
    /// bytes sent (`tests/publish_progress.rs` throttles the Hub emulator to show it).
    HfCli,
    /// Nothing within the file: the backend reports no progress (the `hf` CLI with the user's
    /// own `HF_HUB_DISABLE_PROGRESS_BARS=1`), so the bar moves when the file is done.
    AtEnd,
}

/// One report from a store while it writes a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Transfer {
    /// `done` bytes of the file being written have reached the store, as `measure` counts them
    /// (`done` 0 announces the measure at the start of the file).
    File {
        /// Bytes of the file reached the store so far.
        done: u64,
        /// What `done` counts.
        measure: Measure,
    },
    /// The file (`bytes` long) is committed in the local checkout and waits for a push (a
    /// `github:` store): it counts as sent once a push ends.
    Staged {
        /// The file's size.
        bytes: u64,
    },
    /// A `git push` is under way: `written` bytes of pack written to the remote so far (git's
    /// "Writing objects" figure), for commits of `waiting` bytes of files.
    Push {
        /// Bytes of pack written so far.
        written: u64,
        /// Bytes of the files the pushed commits carry.
        waiting: u64,
    },
    /// The push ended: every staged file is on the remote.
    Pushed,
}

/// The bytes of one store's uploads counted as sent, folded from the [`Transfer`] reports.
/// Pure, so each rule has a table test.
///
/// - a file's own reports move the position within it, never past its size, never back
///   within one attempt ([`Tally::start_file`] starts an attempt again at zero);
/// - a file committed by an earlier attempt stays staged, so a retry that only pushes does not
///   count it twice;
/// - a file that is only staged (a `github:` commit) adds nothing until a push: a push's
///   written pack bytes move the position within the staged bytes, and its end settles them;
/// - a file that was not staged counts whole once it is done ([`Tally::file_done`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    settled: u64,
    staged: u64,
    current: u64,
    file_staged: bool,
}

impl Tally {
    /// Bytes counted as sent.
    pub fn position(&self) -> u64 {
        self.settled + self.current
    }

    /// An attempt at writing a file begins. A commit an earlier attempt made stays staged (a
    /// retry after a failed push finds the file committed and only pushes).
    pub fn start_file(&mut self) {
        self.current = 0;
    }

    /// A report while a file of `size` bytes is written.
    pub fn report(&mut self, size: u64, t: Transfer) {
        match t {
            Transfer::File { done, .. } => {
                self.current = self.current.max(done.min(size));
            }
            Transfer::Staged { bytes } => {
                self.staged += bytes;
                self.file_staged = true;
                self.current = 0;
            }
            Transfer::Push { written, .. } => {
                self.current = self.current.max(written.min(self.staged));
            }
            Transfer::Pushed => {
                self.settled += self.staged;
                self.staged = 0;
                self.current = 0;
            }
        }
    }

    /// The write of a file of `size` bytes returned.
    pub fn file_done(&mut self, size: u64) {
        if !self.file_staged {
            self.settled += size;
            self.current = 0;
        }
        self.file_staged = false;
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, then one final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// One line of the `hf` CLI's upload progress (huggingface_hub 2.4.0 with hf-xet 1.8.0, its
/// tqdm format `DESC: PCT|BAR| DONE / TOTAL[, RATE]`, sizes like `49.8MB`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HfLine {
    /// A file's own bar (its description is the local path, indented by two spaces).
    File {
        /// Bytes done.
        done: u64,
        /// Bytes in all.
        total: u64,
    },
    /// "Processing Files (a / b)": every file of the call.
    Processing {
        /// Files done.
        done: u64,
        /// Files in all.
        total: u64,
    },
    /// "New Data Upload": bytes sent after deduplication.
    NewData {
        /// Bytes sent.
        done: u64,
        /// Bytes to send.
        total: u64,
    },
}

/// Parse one segment (a line or a `\r`-ended redraw, ANSI codes removed) of the `hf` CLI's
/// stderr; `None` for anything that is not a byte progress line (a "Validating" percentage, an
/// error message).
pub fn parse_hf_line(segment: &str) -> Option<HfLine> {
    let (desc, rest) = segment
        .split_once(" : ")
        .or_else(|| segment.split_once(": "))?;
    // `PCT|BAR| DONE / TOTAL[, RATE]`: the sizes follow the last `|`.
    let sizes = rest.rsplit_once('|')?.1;
    let sizes = sizes.split(',').next()?.trim();
    let (done, total) = sizes.split_once(" / ")?;
    let (done, total) = (
        parse_tqdm_bytes(done.trim())?,
        parse_tqdm_bytes(total.trim())?,
    );
    let desc_trim = desc.trim();
    if desc_trim.starts_with("Processing Files") {
        Some(HfLine::Processing { done, total })
    } else if desc_trim == "New Data Upload" {
        Some(HfLine::NewData { done, total })
    } else if desc.starts_with("  ") && !desc_trim.is_empty() {
        Some(HfLine::File { done, total })
    } else {
        None
    }
}

/// tqdm's `format_sizeof` with divisor 1000 followed by `B`: `0.00B`, `512B`, `8.39MB`,
/// `49.3MB`, `105MB`, `1.20GB`.
pub fn parse_tqdm_bytes(s: &str) -> Option<u64> {
    let s = s.strip_suffix('B')?;
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        'G' => (&s[..s.len() - 1], 1e9),
        'T' => (&s[..s.len() - 1], 1e12),
        'P' => (&s[..s.len() - 1], 1e15),
        c if c.is_ascii_digit() => (s, 1.0),
        _ => return None,
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Some((v * mult).round() as u64)
}

/// The bytes on one `git push --progress` "Writing objects" segment: `Writing objects:  66%
/// (2/3), 4.06 MiB | 2.80 MiB/s` → 4.06 MiB. `None` for a segment without a byte figure (git
/// shows one only after its first second) and for every other phase (counting, compressing).
pub fn parse_git_push_bytes(segment: &str) -> Option<u64> {
    let rest = segment.trim_start().strip_prefix("Writing objects:")?;
    let figure = rest.split_once(", ")?.1;
    let figure = figure.split('|').next()?.trim();
    let figure = figure.strip_suffix(", done.").unwrap_or(figure).trim();
    let (num, unit) = figure.split_once(' ')?;
    let mult: u64 = match unit {
        "byte" | "bytes" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    // git prints `%u.%2.2u` for KiB and up, truncated: whole units then hundredths.
    let (whole, frac) = num.split_once('.').unwrap_or((num, "0"));
    let whole: u64 = whole.parse().ok()?;
    let hundredths: u64 = match frac.len() {
        1 => frac.parse::<u64>().ok()? * 10,
        2 => frac.parse().ok()?,
        _ => return None,
    };
    Some(whole * mult + hundredths * mult / 100)
}

/// What [`wait_reading_progress`] saw of a child that ran to its end.
pub(crate) struct Finished {
    pub status: std::process::ExitStatus,
    /// Its stdout, whole.
    pub stdout: Vec<u8>,
    /// Its stderr without the progress segments ([`ProgressText::finish`]).
    pub kept: String,
}

/// Wait for `child` (stdout and stderr piped) while reading its stderr as it comes: each
/// segment goes to `parse`, which says whether it was progress. Stdout is drained on a second
/// thread, so a chatty tool cannot stall on a full pipe.
pub(crate) fn wait_reading_progress(
    mut child: std::process::Child,
    parse: &mut dyn FnMut(&str) -> bool,
) -> std::io::Result<Finished> {
    use std::io::Read;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let mut text = ProgressText::new();
    let (out, read) = std::thread::scope(|scope| {
        let drain = scope.spawn(move || {
            let mut buf = Vec::new();
            stdout.read_to_end(&mut buf).map(|_| buf)
        });
        let mut buf = [0u8; 8192];
        let read = loop {
            match stderr.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => text.feed(&buf[..n], parse),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        (drain.join().expect("reading a pipe does not panic"), read)
    });
    let kept = text.finish(parse);
    let status = child.wait()?;
    read?;
    Ok(Finished {
        status,
        stdout: out?,
        kept,
    })
}

/// Reads a tool's stderr as it comes, hands each byte figure to a callback and keeps the rest
/// (the lines that are not progress) for an error message, bounded.
struct ProgressText {
    /// Bytes of the segment not yet ended. Kept as bytes: a read may end inside a multi-byte
    /// character, which decodes only once its last byte has come (a `\r` or `\n` byte is never
    /// part of one, so a segment ends on a character boundary).
    pending: Vec<u8>,
    kept: String,
}

/// Most bytes of non-progress stderr kept for an error message.
const KEPT_LIMIT: usize = 256 * 1024;

impl ProgressText {
    pub fn new() -> Self {
        Self {
            pending: Vec::new(),
            kept: String::new(),
        }
    }

    /// Feed what was read; `parse` sees each complete segment and returns whether it was
    /// progress (else it is kept).
    pub fn feed(&mut self, bytes: &[u8], parse: &mut dyn FnMut(&str) -> bool) {
        self.pending.extend_from_slice(bytes);
        while let Some(i) = self.pending.iter().position(|b| matches!(b, b'\r' | b'\n')) {
            let seg: Vec<u8> = self.pending.drain(..=i).collect();
            self.segment(&String::from_utf8_lossy(&seg), parse);
        }
    }

    /// The end of the stream: the rest is one last segment.
    pub fn finish(mut self, parse: &mut dyn FnMut(&str) -> bool) -> String {
        let rest = std::mem::take(&mut self.pending);
        self.segment(&String::from_utf8_lossy(&rest), parse);
        self.kept
    }

    fn segment(&mut self, raw: &str, parse: &mut dyn FnMut(&str) -> bool) {
        let clean = strip_ansi(raw.trim_end_matches(['\r', '\n']));
        if clean.trim().is_empty() || parse(&clean) {
            return;
        }
        if self.kept.len() + clean.len() < KEPT_LIMIT {
            self.kept.push_str(&clean);
            self.kept.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool's progress output split into the segments a terminal would overwrite or scroll:
    /// at `\r` and `\n`, with ANSI escape sequences removed.
    fn segments(text: &str) -> impl Iterator<Item = String> + '_ {
        text.split(['\r', '\n'])
            .map(strip_ansi)
            .filter(|s| !s.trim().is_empty())
    }

    /// Real stderr of `hf buckets cp FILE hf://buckets/…` (huggingface_hub 2.4.0, hf-xet
    /// 1.8.0) against the Hub emulator, with `HF_HUB_DISABLE_PROGRESS_BARS=0` and `--format
    /// json`, stderr a pipe: a 47 MiB and a 20 MiB file of random bytes.
    const HF_47: &str = include_str!("progress_fixtures/hf-cp-47mib.stderr");
    const HF_20: &str = include_str!("progress_fixtures/hf-cp-20mib.stderr");
    /// Real stderr of `git push --progress` of a 24 MiB chunk to a bare repository through a
    /// receive-pack fed 1 MiB every quarter second, and of 67 MiB of chunks unthrottled.
    const GIT_24: &str = include_str!("progress_fixtures/git-push-24mib-throttled.stderr");
    const GIT_67: &str = include_str!("progress_fixtures/git-push-67mib.stderr");

    fn file_bytes(text: &str) -> Vec<(u64, u64)> {
        segments(text)
            .filter_map(|s| match parse_hf_line(&s) {
                Some(HfLine::File { done, total }) => Some((done, total)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_hf_clis_file_lines_are_its_byte_progress() {
        assert_eq!(
            file_bytes(HF_47),
            [
                (8_390_000, 49_300_000),
                (8_390_000, 49_300_000),
                (49_300_000, 49_300_000),
                (49_300_000, 49_300_000)
            ]
        );
        assert_eq!(
            file_bytes(HF_20),
            [
                (12_100_000, 21_000_000),
                (12_100_000, 21_000_000),
                (21_000_000, 21_000_000),
                (21_000_000, 21_000_000)
            ]
        );
        // The overview bars are recognised and are not the file's.
        let overview: Vec<HfLine> = segments(HF_20)
            .filter_map(|s| parse_hf_line(&s))
            .filter(|l| !matches!(l, HfLine::File { .. }))
            .collect();
        assert!(overview.contains(&HfLine::Processing {
            done: 12_100_000,
            total: 21_000_000
        }));
        assert!(overview.contains(&HfLine::NewData {
            done: 21_000_000,
            total: 21_000_000
        }));
    }

    #[test]
    fn hf_lines_and_sizes_as_a_table() {
        for (line, want) in [
            (
                "  /tmp/prog/f20.bin           :  57%|█████▋    | 12.1MB / 21.0MB            ",
                Some(HfLine::File {
                    done: 12_100_000,
                    total: 21_000_000,
                }),
            ),
            (
                "  ...ls/v26/pop/pop.pkl.chunk01of02:   3%|▎| 512B / 1.20GB ",
                Some(HfLine::File {
                    done: 512,
                    total: 1_200_000_000,
                }),
            ),
            (
                "Processing Files (0 / 1)      :  79%|███████▉  | 49.8MB / 62.9MB, 4.91MB/s  ",
                Some(HfLine::Processing {
                    done: 49_800_000,
                    total: 62_900_000,
                }),
            ),
            (
                "New Data Upload               :  17%|█▋        | 8.39MB / 49.3MB,   ???B/s  ",
                Some(HfLine::NewData {
                    done: 8_390_000,
                    total: 49_300_000,
                }),
            ),
            (
                "Validating                    : ██████████| 100%            ",
                None,
            ),
            ("Error: Bucket not found: ns/b", None),
            ("Traceback (most recent call last):", None),
            ("  File \"x.py\", line 3, in <module>", None),
        ] {
            assert_eq!(parse_hf_line(line), want, "{line}");
        }
        for (s, want) in [
            ("0.00B", Some(0)),
            ("512B", Some(512)),
            ("1.00kB", Some(1000)),
            ("8.39MB", Some(8_390_000)),
            ("105MB", Some(105_000_000)),
            ("1.20GB", Some(1_200_000_000)),
            ("12.1", None),
            ("???B", None),
            ("-1.0MB", None),
        ] {
            assert_eq!(parse_tqdm_bytes(s), want, "{s}");
        }
    }

    #[test]
    fn git_push_writing_objects_figures() {
        let got: Vec<u64> = segments(GIT_24)
            .filter_map(|s| parse_git_push_bytes(&s))
            .collect();
        let mib = |whole: u64, hundredths: u64| whole * (1 << 20) + hundredths * (1 << 20) / 100;
        assert_eq!(
            got,
            [
                mib(4, 6),
                mib(7, 6),
                mib(9, 6),
                mib(11, 6),
                mib(15, 6),
                mib(19, 6),
                mib(21, 6),
                mib(23, 6),
                mib(24, 1)
            ]
        );
        let got: Vec<u64> = segments(GIT_67)
            .filter_map(|s| parse_git_push_bytes(&s))
            .collect();
        assert_eq!(got, [mib(47, 9), mib(47, 9), mib(67, 2)]);
        for (line, want) in [
            ("Writing objects:  50% (1/2)", None),
            (
                "Writing objects: 100% (2/2), 271 bytes | 24.00 KiB/s, done.",
                Some(271),
            ),
            (
                "Writing objects: 100% (1/1), 1 byte | 1 byte/s, done.",
                Some(1),
            ),
            (
                "Writing objects:  10% (1/10), 1.50 GiB | 3.00 MiB/s",
                Some((1 << 30) + (1 << 30) / 2),
            ),
            ("Counting objects: 100% (5/5), done.", None),
            ("Compressing objects:  50% (1/2)", None),
            (
                "Total 4 (delta 0), reused 2 (delta 0), pack-reused 0 (from 0)",
                None,
            ),
            ("Writing objects:  66% (2/3), 4.060 MiB | 2.80 MiB/s", None),
        ] {
            assert_eq!(parse_git_push_bytes(line), want, "{line}");
        }
    }

    #[test]
    fn the_tally_as_a_table() {
        use Transfer::*;
        let file = |done| File {
            done,
            measure: Measure::Copied,
        };
        // (steps, position after each)
        enum S {
            Start,
            R(u64, Transfer),
            Done(u64),
        }
        let cases: Vec<(&str, Vec<S>, Vec<u64>)> = vec![
            (
                "a file's reports move within it, capped, never back",
                vec![
                    S::Start,
                    S::R(100, file(0)),
                    S::R(100, file(40)),
                    S::R(100, file(30)),
                    S::R(100, file(400)),
                    S::Done(100),
                ],
                vec![0, 0, 40, 40, 100, 100],
            ),
            (
                "a retried attempt starts again at zero",
                vec![
                    S::Start,
                    S::R(100, file(60)),
                    S::Start,
                    S::R(100, file(10)),
                    S::Done(100),
                ],
                vec![0, 60, 0, 10, 100],
            ),
            (
                "a file with no reports counts when done",
                vec![S::Start, S::Done(7), S::Start, S::Done(5)],
                vec![0, 7, 7, 12],
            ),
            (
                "staged files wait for a push; its pack bytes move within them; its end settles",
                vec![
                    S::Start,
                    S::R(50, Staged { bytes: 50 }),
                    S::Done(50),
                    S::Start,
                    S::R(30, Staged { bytes: 30 }),
                    S::R(
                        30,
                        Push {
                            written: 20,
                            waiting: 80,
                        },
                    ),
                    S::R(
                        30,
                        Push {
                            written: 95,
                            waiting: 80,
                        },
                    ),
                    S::R(30, Pushed),
                    S::Done(30),
                    S::Start,
                    S::Done(4),
                ],
                vec![0, 0, 0, 0, 0, 20, 80, 80, 80, 80, 84],
            ),
            (
                "a retry after a failed push finds the file committed: counted once",
                vec![
                    S::Start,
                    S::R(60, Staged { bytes: 60 }),
                    S::R(
                        60,
                        Push {
                            written: 10,
                            waiting: 60,
                        },
                    ),
                    S::Start,
                    S::R(60, Pushed),
                    S::Done(60),
                ],
                vec![0, 0, 10, 0, 60, 60],
            ),
        ];
        for (name, steps, want) in cases {
            let mut t = Tally::default();
            let mut got = Vec::new();
            for s in steps {
                match s {
                    S::Start => t.start_file(),
                    S::R(size, r) => t.report(size, r),
                    S::Done(size) => t.file_done(size),
                }
                got.push(t.position());
            }
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_child_is_waited_for_with_its_stderr_read_as_it_comes_and_its_stdout_drained() {
        use std::process::{Command, Stdio};
        // 1 MiB of stdout: more than a pipe holds, so an undrained stdout would stall the child.
        let script = "head -c 1048576 /dev/zero; printf 'Writing objects: 100%% (3/3), 2.00 KiB | 1 MiB/s\\rfatal: no\\n' >&2; exit 3";
        let child = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut seen = Vec::new();
        let finished = wait_reading_progress(child, &mut |s| {
            seen.extend(parse_git_push_bytes(s));
            s.starts_with("Writing objects")
        })
        .unwrap();
        assert_eq!(finished.status.code(), Some(3));
        assert_eq!(finished.stdout.len(), 1 << 20);
        assert_eq!(finished.kept, "fatal: no\n");
        assert_eq!(seen, [2048]);
    }

    #[test]
    fn progress_text_keeps_what_is_not_progress() {
        let mut pt = ProgressText::new();
        let mut seen = Vec::new();
        let mut parse = |s: &str| {
            let p = parse_git_push_bytes(s);
            if let Some(b) = p {
                seen.push(b);
            }
            p.is_some() || s.starts_with("Writing objects")
        };
        // Fed in pieces that cut segments in two.
        let text = GIT_24.as_bytes();
        for piece in text.chunks(37) {
            pt.feed(piece, &mut parse);
        }
        let kept = pt.finish(&mut parse);
        assert_eq!(seen.len(), 9);
        assert!(kept.contains("Total 3 (delta 1)"), "{kept}");
        assert!(!kept.contains("Writing objects"), "{kept}");
    }

    /// A read that ends inside a multi-byte character (here every possible cut of "é" and
    /// "—") keeps the character whole in what is kept for the error message.
    #[test]
    fn a_character_cut_between_two_reads_is_kept_whole() {
        let text = "remote: refusé — le dépôt est plein\nTotal 3\n".as_bytes();
        for cut in 1..text.len() {
            let mut pt = ProgressText::new();
            let mut parse = |_: &str| false;
            pt.feed(&text[..cut], &mut parse);
            pt.feed(&text[cut..], &mut parse);
            assert_eq!(
                pt.finish(&mut parse),
                "remote: refusé — le dépôt est plein\nTotal 3\n",
                "cut at byte {cut}"
            );
        }
    }
}
