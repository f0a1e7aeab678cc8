//! Which origin a download asks first, from what this run has seen of each (docs/device.md,
//! *Origin policy*). Pure: every rule here is a function over typed observations and a clock
//! it is given; [`Book`] only keeps the observations.
//!
//! The rules:
//! - an origin that missed its deadline, the minimum transfer rate, or answered nothing within
//!   the response timeout is **given up**: every later artifact goes to the other origin first,
//!   and the given-up one is asked only when the other failed too. The give-up lasts
//!   [`DEMOTE_FOR`] (a CLI run is shorter than that; the daemon tries the origin first again
//!   once it has passed);
//! - an origin no connection could be made to ([`NO_CONNECTION_LIMIT`] attempts in a row:
//!   refused, or the connect timed out) is given up the same way; one such attempt is a network
//!   hiccup as much as a dead origin, and is not held against it ([`after`]);
//! - an origin whose measured rate on this run's transfers is more than [`FAR_SLOWER`] times
//!   below the other's is left for it (asked second);
//! - while a download runs slower than [`PROBE_BELOW`] on an origin whose speed the other has
//!   not been compared with, a transfer that would still take longer than [`LEAVE_IF_ETA`] after
//!   [`MEASURE_AFTER`] is moved to the other origin to measure it (the bytes already staged are
//!   kept and resumed); the origin it left is asked again only if the other fails.

use std::time::{Duration, Instant};

use crate::origin::OriginKind;

/// How long a given-up origin stays second.
pub const DEMOTE_FOR: Duration = Duration::from_secs(30 * 60);
/// So many attempts in a row that could not connect to an origin (refused, or the connect
/// timed out), with no answer from it between them, give it up.
pub const NO_CONNECTION_LIMIT: u32 = 3;
/// A measured rate this many times below the other origin's leaves the slower one second.
pub const FAR_SLOWER: u64 = 10;
/// Transfers measured for less than this (in total, per origin) and smaller than
/// [`MEASURE_BYTES`] are not compared.
pub const MEASURE_AFTER: Duration = Duration::from_secs(3);
/// So many bytes are enough to judge a rate by, however short they took (a fast origin).
pub const MEASURE_BYTES: u64 = 512 * 1024;
/// A download whose remaining bytes would take less than this at its current rate finishes
/// where it is, however slow the origin is compared with the other.
pub const LEAVE_IF_ETA: Duration = Duration::from_secs(10);
/// A download is moved to an origin not measured yet only when it runs slower than this: a
/// healthy preferred origin is not left just to measure the other.
pub const PROBE_BELOW: u64 = 1024 * 1024;

/// Why an origin was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// It used up its deadline ([`crate::HttpConfig::artifact_deadline`]).
    Deadline,
    /// A body arrived slower than [`crate::HttpConfig::min_rate`].
    MinRate,
    /// No response head within [`crate::HttpConfig::response_timeout`], or a connection that
    /// stayed silent past the idle timeout (accepted, never answered; or trickled).
    Silent,
    /// No connection could be made on [`NO_CONNECTION_LIMIT`] attempts in a row.
    NoConnection,
}

impl GiveUp {
    /// The give-up as a phrase (`missed its deadline`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            GiveUp::Deadline => "missed its deadline",
            GiveUp::MinRate => "slower than the minimum rate",
            GiveUp::Silent => "did not answer in time",
            GiveUp::NoConnection => "could not be connected to, several times in a row",
        }
    }
}

/// What one attempt said of its origin ([`crate::Error::said`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// It answered: a document, bytes, a status, a refusal (or left for a faster origin).
    Answered,
    /// No connection could be made: refused, no address, or the connect timed out.
    NoConnection,
    /// It failed one of the policy's own criteria: no response head in time, idle before the
    /// head, below the minimum rate, its deadline.
    Failed(GiveUp),
}

/// The give-up rule: after an attempt that `said` this, with `in_a_row` attempts before it that
/// could not connect, the new count and the give-up, if any. Pure.
/// - a miss of the policy's own criteria gives the origin up at once;
/// - no connection gives it up only as the [`NO_CONNECTION_LIMIT`]th in a row (the count then
///   starts again, for when the give-up has passed);
/// - an answer ends the run of connect failures.
pub fn after(said: Said, in_a_row: u32) -> (u32, Option<GiveUp>) {
    match said {
        Said::Answered => (0, None),
        Said::Failed(why) => (0, Some(why)),
        Said::NoConnection => match in_a_row.saturating_add(1) {
            n if n >= NO_CONNECTION_LIMIT => (0, Some(GiveUp::NoConnection)),
            n => (n, None),
        },
    }
}

/// Payload bytes an origin moved on this run and the time they took (summed over downloads;
/// each download's time is wall clock from its first range request, all connections together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    /// Payload bytes.
    pub bytes: u64,
    /// Time they took.
    pub elapsed: Duration,
}

impl Measured {
    /// Bytes per second, once there is enough to judge by ([`MEASURE_AFTER`] or
    /// [`MEASURE_BYTES`]).
    pub fn rate(&self) -> Option<u64> {
        let enough = self.elapsed >= MEASURE_AFTER || self.bytes >= MEASURE_BYTES;
        (enough && !self.elapsed.is_zero())
            .then(|| (self.bytes as f64 / self.elapsed.as_secs_f64()) as u64)
    }

    /// Add another download's bytes and time (saturating).
    pub fn add(&mut self, other: Measured) {
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.elapsed = self.elapsed.saturating_add(other.elapsed);
    }
}

/// What the run has seen of one origin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// When the origin was given up and why; `None` while it is not.
    pub given_up: Option<(Instant, GiveUp)>,
    /// What it moved this run.
    pub measured: Measured,
    /// Attempts in a row that could not connect to it (see [`after`]).
    pub no_connection: u32,
}

impl Seen {
    /// The give-up still in force at `now`.
    pub fn given_up_at(&self, now: Instant) -> Option<GiveUp> {
        self.given_up
            .filter(|(at, _)| now.saturating_duration_since(*at) < DEMOTE_FOR)
            .map(|(_, why)| why)
    }
}

/// Where an origin stands in the order, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// In its configured place.
    Preferred,
    /// Asked after the others: given up (for [`DEMOTE_FOR`]).
    GivenUp(GiveUp),
    /// Asked after the others: its measured rate is far below the other's.
    FarSlower {
        /// Its measured rate, in bytes per second.
        rate: u64,
        /// The other origin's rate, in bytes per second.
        other: u64,
    },
}

/// The order to ask the origins in: `seen` in the configured order, each with what the run saw
/// of it. Preferred origins first (a far slower one after a faster), then far slower ones, then
/// given-up ones, each group in the configured order.
pub fn order(seen: &[(OriginKind, Seen)], now: Instant) -> Vec<(OriginKind, Standing)> {
    let best_other = |i: usize| {
        seen.iter()
            .enumerate()
            .filter(|(j, (_, s))| *j != i && s.given_up_at(now).is_none())
            .filter_map(|(_, (_, s))| s.measured.rate())
            .max()
    };
    let mut out: Vec<(usize, (OriginKind, Standing))> = seen
        .iter()
        .enumerate()
        .map(|(i, (kind, s))| {
            let standing = match (s.given_up_at(now), s.measured.rate(), best_other(i)) {
                (Some(why), _, _) => Standing::GivenUp(why),
                (None, Some(rate), Some(other)) if rate.saturating_mul(FAR_SLOWER) < other => {
                    Standing::FarSlower { rate, other }
                }
                _ => Standing::Preferred,
            };
            (i, (*kind, standing))
        })
        .collect();
    let group = |s: &Standing| match s {
        Standing::Preferred => 0,
        Standing::FarSlower { .. } => 1,
        Standing::GivenUp(_) => 2,
    };
    out.sort_by_key(|(i, (_, s))| (group(s), *i));
    out.into_iter().map(|(_, o)| o).collect()
}

/// Whether a download running on one origin should move to `other` now: `this` is what this
/// download moved so far, `remaining` the bytes it still needs. Only after [`MEASURE_AFTER`],
/// only when the rest would take longer than [`LEAVE_IF_ETA`], never to a given-up origin; then
/// to an origin not measured yet when this one runs below [`PROBE_BELOW`] (to measure it), or
/// to one measured more than [`FAR_SLOWER`] times faster.
pub fn leave(this: Measured, remaining: u64, other: &Seen, now: Instant) -> bool {
    let Some(rate) = this.rate() else {
        return false;
    };
    if other.given_up_at(now).is_some() {
        return false;
    }
    let eta = remaining as f64 / rate.max(1) as f64;
    if eta < LEAVE_IF_ETA.as_secs_f64() {
        return false;
    }
    match other.measured.rate() {
        None => rate < PROBE_BELOW,
        Some(o) => rate.saturating_mul(FAR_SLOWER) < o,
    }
}

/// What a run saw of each origin, kept by the [`crate::Downloader`] for its lifetime (one CLI
/// run, or the daemon's: then a give-up ends after [`DEMOTE_FOR`] and the rates are the last
/// [`DEMOTE_FOR`]'s).
#[derive(Debug, Clone, Default)]
pub struct Book {
    hf: Seen,
    github: Seen,
    /// When the rates started being summed (they are forgotten after [`DEMOTE_FOR`]).
    since: Option<Instant>,
}

impl Book {
    /// What this run has seen of the origin `kind`.
    pub fn seen(&self, kind: OriginKind) -> Seen {
        match kind {
            OriginKind::HuggingFace => self.hf,
            OriginKind::GitHub => self.github,
        }
    }

    fn slot(&mut self, kind: OriginKind) -> &mut Seen {
        match kind {
            OriginKind::HuggingFace => &mut self.hf,
            OriginKind::GitHub => &mut self.github,
        }
    }

    /// Give the origin `kind` up at `now` for `why`; it is asked after the others for
    /// [`DEMOTE_FOR`].
    pub fn give_up(&mut self, kind: OriginKind, why: GiveUp, now: Instant) {
        self.slot(kind).given_up = Some((now, why));
    }

    /// Record what one attempt said of `kind` ([`after`]).
    pub fn note(&mut self, kind: OriginKind, said: Said, now: Instant) {
        let (in_a_row, give_up) = after(said, self.slot(kind).no_connection);
        self.slot(kind).no_connection = in_a_row;
        if let Some(why) = give_up {
            self.give_up(kind, why, now);
        }
    }

    /// Add `m` to what `kind` moved; the rates of both origins are forgotten [`DEMOTE_FOR`] after
    /// they started being summed.
    pub fn measured(&mut self, kind: OriginKind, m: Measured, now: Instant) {
        if self
            .since
            .is_some_and(|s| now.saturating_duration_since(s) >= DEMOTE_FOR)
        {
            self.hf.measured = Measured::default();
            self.github.measured = Measured::default();
            self.since = None;
        }
        self.since.get_or_insert(now);
        self.slot(kind).measured.add(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OriginKind::{GitHub, HuggingFace};

    fn m(bytes: u64, secs: u64) -> Measured {
        Measured {
            bytes,
            elapsed: Duration::from_secs(secs),
        }
    }

    fn seen(given_up: Option<(u64, GiveUp)>, measured: Measured, t0: Instant) -> Seen {
        Seen {
            given_up: given_up.map(|(at, why)| (t0 + Duration::from_secs(at), why)),
            measured,
            no_connection: 0,
        }
    }

    /// The order as a table: configured order unless one origin was given up (for 30 min) or
    /// measured far slower than the other.
    #[test]
    fn order_table() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(60);
        let none = Measured::default();
        let mb = 1 << 20;
        use Standing::*;
        type Case<'a> = (&'a str, Seen, Seen, &'a [(OriginKind, Standing)]);
        let cases: &[Case<'_>] = &[
            (
                "nothing seen: configured order",
                seen(None, none, t0),
                seen(None, none, t0),
                &[(HuggingFace, Preferred), (GitHub, Preferred)],
            ),
            (
                "HF trickled: GitHub first",
                seen(Some((0, GiveUp::MinRate)), none, t0),
                seen(None, none, t0),
                &[(GitHub, Preferred), (HuggingFace, GivenUp(GiveUp::MinRate))],
            ),
            (
                "HF silent: GitHub first",
                seen(Some((10, GiveUp::Silent)), m(5 * mb, 5), t0),
                seen(None, none, t0),
                &[(GitHub, Preferred), (HuggingFace, GivenUp(GiveUp::Silent))],
            ),
            (
                "both given up: configured order among them",
                seen(Some((0, GiveUp::Silent)), none, t0),
                seen(Some((0, GiveUp::Deadline)), none, t0),
                &[
                    (HuggingFace, GivenUp(GiveUp::Silent)),
                    (GitHub, GivenUp(GiveUp::Deadline)),
                ],
            ),
            (
                "HF 100x slower: GitHub first",
                seen(None, m(60_000 * 10, 10), t0),
                seen(None, m(6_000_000 * 5, 5), t0),
                &[
                    (GitHub, Preferred),
                    (
                        HuggingFace,
                        FarSlower {
                            rate: 60_000,
                            other: 6_000_000,
                        },
                    ),
                ],
            ),
            (
                "HF 5x slower: not far enough, configured order",
                seen(None, m(mb * 10, 10), t0),
                seen(None, m(5 * mb * 10, 10), t0),
                &[(HuggingFace, Preferred), (GitHub, Preferred)],
            ),
            (
                "GitHub far slower: stays second",
                seen(None, m(50 * mb, 5), t0),
                seen(None, m(mb, 5), t0),
                &[
                    (HuggingFace, Preferred),
                    (
                        GitHub,
                        FarSlower {
                            rate: mb / 5,
                            other: 10 * mb,
                        },
                    ),
                ],
            ),
            (
                "too short a measurement is not compared",
                seen(None, m(1000, 2), t0),
                seen(None, m(50 * mb, 5), t0),
                &[(HuggingFace, Preferred), (GitHub, Preferred)],
            ),
            (
                "a fast origin's short transfer is enough to compare by",
                seen(None, m(60_000 * 4, 4), t0),
                seen(
                    None,
                    Measured {
                        bytes: mb,
                        elapsed: Duration::from_millis(100),
                    },
                    t0,
                ),
                &[
                    (GitHub, Preferred),
                    (
                        HuggingFace,
                        FarSlower {
                            rate: 60_000,
                            other: 10 * mb,
                        },
                    ),
                ],
            ),
            (
                "a given-up origin's rate is not a yardstick",
                seen(None, m(mb, 10), t0),
                seen(Some((0, GiveUp::Deadline)), m(100 * mb, 10), t0),
                &[
                    (HuggingFace, Preferred),
                    (GitHub, GivenUp(GiveUp::Deadline)),
                ],
            ),
        ];
        for (what, hf, gh, want) in cases {
            let got = order(&[(HuggingFace, *hf), (GitHub, *gh)], now);
            assert_eq!(&got, want, "{what}");
        }
        // A give-up ends after DEMOTE_FOR: the daemon asks Hugging Face first again.
        let hf = seen(Some((0, GiveUp::Silent)), none, t0);
        let later = t0 + DEMOTE_FOR;
        assert_eq!(
            order(&[(HuggingFace, hf), (GitHub, Seen::default())], later)[0],
            (HuggingFace, Preferred)
        );
        assert_eq!(
            order(
                &[(HuggingFace, hf), (GitHub, Seen::default())],
                later - Duration::from_secs(1)
            )[0],
            (GitHub, Preferred)
        );
    }

    /// When a running download moves to the other origin, as a table.
    #[test]
    fn leave_table() {
        let t0 = Instant::now();
        let mb = 1 << 20;
        let fresh = Seen::default();
        let cases: &[(&str, Measured, u64, Seen, bool)] = &[
            (
                "not measured long enough",
                m(1000, 2),
                100 * mb,
                fresh,
                false,
            ),
            (
                "slow, other unknown: probe it",
                m(60_000 * 3, 3),
                8 * mb,
                fresh,
                true,
            ),
            (
                "healthy, other unknown: stay, however long the rest takes",
                m(2 * mb * 3, 3),
                200 * mb,
                fresh,
                false,
            ),
            (
                "slow but nearly done: finish here",
                m(60_000 * 3, 3),
                500_000,
                fresh,
                false,
            ),
            (
                "other given up: stay",
                m(60_000 * 3, 3),
                8 * mb,
                seen(Some((0, GiveUp::Silent)), Measured::default(), t0),
                false,
            ),
            (
                "other measured far faster: go",
                m(60_000 * 3, 3),
                8 * mb,
                seen(None, m(6_000_000 * 3, 3), t0),
                true,
            ),
            (
                "other measured, not far faster: stay",
                m(600_000 * 30, 30),
                80 * mb,
                seen(None, m(1_200_000 * 3, 3), t0),
                false,
            ),
        ];
        for (what, this, remaining, other, want) in cases {
            assert_eq!(
                leave(*this, *remaining, other, t0 + Duration::from_secs(5)),
                *want,
                "{what}"
            );
        }
    }

    /// The give-up rule as a table: a miss of the policy's own criteria gives up at once; no
    /// connection only as the third in a row; an answer ends the run.
    #[test]
    fn after_table() {
        use Said::*;
        let cases = [
            (Answered, 0, (0, None)),
            (Answered, 2, (0, None)),
            (Failed(GiveUp::Silent), 0, (0, Some(GiveUp::Silent))),
            (Failed(GiveUp::MinRate), 1, (0, Some(GiveUp::MinRate))),
            (Failed(GiveUp::Deadline), 0, (0, Some(GiveUp::Deadline))),
            (NoConnection, 0, (1, None)),
            (NoConnection, 1, (2, None)),
            (NoConnection, 2, (0, Some(GiveUp::NoConnection))),
            (NoConnection, u32::MAX, (0, Some(GiveUp::NoConnection))),
        ];
        for (said, in_a_row, want) in cases {
            assert_eq!(after(said, in_a_row), want, "{said:?} after {in_a_row}");
        }
    }

    /// One connect failure, then an answer, then two more: never three in a row, never given
    /// up; three in a row are, for DEMOTE_FOR, and the count starts again.
    #[test]
    fn the_book_gives_up_only_a_run_of_connect_failures() {
        let t0 = Instant::now();
        let mut b = Book::default();
        for said in [
            Said::NoConnection,
            Said::Answered,
            Said::NoConnection,
            Said::NoConnection,
        ] {
            b.note(HuggingFace, said, t0);
        }
        assert_eq!(b.seen(HuggingFace).given_up, None);
        assert_eq!(b.seen(HuggingFace).no_connection, 2);
        b.note(HuggingFace, Said::NoConnection, t0);
        assert_eq!(
            b.seen(HuggingFace).given_up_at(t0),
            Some(GiveUp::NoConnection)
        );
        assert_eq!(b.seen(HuggingFace).no_connection, 0);
        assert_eq!(
            b.seen(GitHub),
            Seen::default(),
            "the other origin untouched"
        );
        let order = order(
            &[(HuggingFace, b.seen(HuggingFace)), (GitHub, b.seen(GitHub))],
            t0,
        );
        assert_eq!(
            order,
            [
                (GitHub, Standing::Preferred),
                (HuggingFace, Standing::GivenUp(GiveUp::NoConnection))
            ]
        );
        assert_eq!(b.seen(HuggingFace).given_up_at(t0 + DEMOTE_FOR), None);
    }

    /// The book sums each origin's transfers and forgets rates after DEMOTE_FOR.
    #[test]
    fn book_keeps_the_runs_observations() {
        let t0 = Instant::now();
        let mut b = Book::default();
        b.measured(HuggingFace, m(1000, 1), t0);
        b.measured(HuggingFace, m(2000, 2), t0 + Duration::from_secs(5));
        assert_eq!(b.seen(HuggingFace).measured, m(3000, 3));
        assert_eq!(b.seen(HuggingFace).measured.rate(), Some(1000));
        b.give_up(GitHub, GiveUp::Deadline, t0);
        assert_eq!(b.seen(GitHub).given_up_at(t0), Some(GiveUp::Deadline));
        b.measured(GitHub, m(10, 1), t0 + DEMOTE_FOR);
        assert_eq!(b.seen(HuggingFace).measured, Measured::default());
        assert_eq!(b.seen(GitHub).measured, m(10, 1));
    }
}
