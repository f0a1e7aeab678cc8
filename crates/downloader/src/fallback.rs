//! The one origin-fallback loop of the manifest fetch, the download plan and the download
//! (docs/device.md, *Origin policy*): each origin in the policy's order until one answers; an
//! error no other origin can fix ends the loop at once; an origin a download left for a faster
//! one ([`Error::LeftForFaster`]) is asked once more at the end, to finish from where it stopped.
//!
//! Pure over the attempts it is given: [`first_answer`] does no I/O of its own, and [`then`] is
//! the whole decision, one attempt's result to what the loop does next.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::origin::Origin;

/// Which turn of an origin an attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Its place in the order: the attempt may leave it for a faster origin
    /// ([`crate::policy::leave`]).
    First,
    /// Back after leaving it: the attempt finishes here, whatever the other origin's speed.
    Resumed,
}

/// What the loop does with one attempt's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// The origin answered: the loop ends with it.
    Answer,
    /// No origin can fix this error (a cancel, a full disk, a local file error): it ends the
    /// loop at once, no further origin asked.
    Stop,
    /// The attempt left its origin for a faster one: it comes back at the end (its staged bytes
    /// kept).
    Requeue,
    /// The origin failed: its error is kept and the next origin is asked.
    Next,
}

/// The loop's one decision: what `result`, on an origin's `turn`, leads to. Pure.
pub(crate) fn then<T>(result: &Result<T>, turn: Turn) -> Then {
    match result {
        Ok(_) => Then::Answer,
        Err(e) if e.is_local() => Then::Stop,
        Err(Error::LeftForFaster { .. }) if turn == Turn::First => Then::Requeue,
        Err(_) => Then::Next,
    }
}

/// What [`first_answer`] came to (a stopping error is its `Err`).
#[derive(Debug)]
pub(crate) enum Tried<T> {
    /// `origin` answered `value`, after the `failed` attempts before it (origin, error).
    Answered {
        value: T,
        origin: Origin,
        failed: Vec<(String, Error)>,
    },
    /// Every origin failed: each failure, in the order they happened.
    NoneAnswered(Vec<(String, Error)>),
}

/// Ask the origins of `order` with `attempt` until one answers (see the module docs). `note`
/// hears what each attempt said of its origin, except a stopping error (which says nothing about
/// the origin): `Ok(())` for an answer, the error otherwise.
pub(crate) fn first_answer<T>(
    order: Vec<Origin>,
    mut attempt: impl FnMut(&Origin, Turn) -> Result<T>,
    mut note: impl FnMut(&Origin, Result<(), &Error>),
) -> Result<Tried<T>> {
    let mut queue: VecDeque<(Origin, Turn)> = order.into_iter().map(|o| (o, Turn::First)).collect();
    let mut failed = Vec::new();
    while let Some((origin, turn)) = queue.pop_front() {
        let result = attempt(&origin, turn);
        match (then(&result, turn), result) {
            (Then::Answer, Ok(value)) => {
                note(&origin, Ok(()));
                return Ok(Tried::Answered {
                    value,
                    origin,
                    failed,
                });
            }
            (Then::Stop, Err(e)) => return Err(e),
            (Then::Requeue, Err(e)) => {
                note(&origin, Err(&e));
                queue.push_back((origin, Turn::Resumed));
            }
            (_, Err(e)) => {
                note(&origin, Err(&e));
                failed.push((origin.to_string(), e));
            }
            (_, Ok(_)) => unreachable!("`then` answers every Ok with Answer"),
        }
    }
    Ok(Tried::NoneAnswered(failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::origin::Origins;

    fn net(at: &str) -> Error {
        Error::Transport {
            url: at.into(),
            message: "reset".into(),
        }
    }

    fn left(at: &str) -> Error {
        Error::LeftForFaster {
            url: at.into(),
            rate: 1,
        }
    }

    fn stop() -> Error {
        Error::Cancelled { model: "m".into() }
    }

    /// The decision as a table: an answer ends the loop, a local error stops it, a first turn
    /// that left for a faster origin comes back, anything else is the next origin's turn (a
    /// resumed turn never leaves again).
    #[test]
    fn then_table() {
        let disk = || Error::Io(std::io::Error::other("disk"));
        let space = || Error::InsufficientSpace {
            path: "/data/models".into(),
            needed: 2,
            available: 1,
        };
        let status = || Error::Status {
            url: "u".into(),
            status: 404,
        };
        let cases: Vec<(Result<()>, Turn, Then)> = vec![
            (Ok(()), Turn::First, Then::Answer),
            (Ok(()), Turn::Resumed, Then::Answer),
            (Err(stop()), Turn::First, Then::Stop),
            (Err(disk()), Turn::Resumed, Then::Stop),
            (Err(space()), Turn::First, Then::Stop),
            (Err(left("u")), Turn::First, Then::Requeue),
            (Err(left("u")), Turn::Resumed, Then::Next),
            (Err(net("u")), Turn::First, Then::Next),
            (Err(status()), Turn::Resumed, Then::Next),
        ];
        for (result, turn, want) in cases {
            assert_eq!(then(&result, turn), want, "{result:?} on {turn:?}");
        }
    }

    /// The loop over scripted attempts, as a table: which origins are asked on which turn, what
    /// it comes to, and what it notes of each origin. Origins: 0 = Hugging Face, 1 = GitHub.
    #[test]
    fn the_loop_over_scripted_attempts() {
        type Turns = &'static [(usize, Turn)];
        /// Ok((answering origin, failures before)) | Err(Some(failures)) | Err(None) = stopped.
        type Came = std::result::Result<(usize, usize), Option<usize>>;
        /// (origin, whether it answered) for each note.
        type Notes = &'static [(usize, bool)];
        type Case = (&'static str, Vec<Result<u8>>, Turns, Came, Notes);
        use Turn::{First, Resumed};
        let cases: Vec<Case> = vec![
            (
                "the first answers",
                vec![Ok(1)],
                &[(0, First)],
                Ok((0, 0)),
                &[(0, true)],
            ),
            (
                "the second answers after the first failed",
                vec![Err(net("hf")), Ok(2)],
                &[(0, First), (1, First)],
                Ok((1, 1)),
                &[(0, false), (1, true)],
            ),
            (
                "both fail",
                vec![Err(net("hf")), Err(net("gh"))],
                &[(0, First), (1, First)],
                Err(Some(2)),
                &[(0, false), (1, false)],
            ),
            (
                "a stop ends the loop at once, noting nothing",
                vec![Err(stop()), Ok(2)],
                &[(0, First)],
                Err(None),
                &[],
            ),
            (
                "a stop on the second",
                vec![Err(net("hf")), Err(stop())],
                &[(0, First), (1, First)],
                Err(None),
                &[(0, false)],
            ),
            (
                "left for the faster, which answers",
                vec![Err(left("hf")), Ok(2)],
                &[(0, First), (1, First)],
                Ok((1, 0)),
                &[(0, false), (1, true)],
            ),
            (
                "left for the faster, which fails: the first finishes",
                vec![Err(left("hf")), Err(net("gh")), Ok(3)],
                &[(0, First), (1, First), (0, Resumed)],
                Ok((0, 1)),
                &[(0, false), (1, false), (0, true)],
            ),
            (
                "both left: each finishes in turn",
                vec![Err(left("hf")), Err(left("gh")), Err(net("hf")), Ok(4)],
                &[(0, First), (1, First), (0, Resumed), (1, Resumed)],
                Ok((1, 1)),
                &[(0, false), (1, false), (0, false), (1, true)],
            ),
            (
                "left, then everything fails: each failure once",
                vec![Err(left("hf")), Err(net("gh")), Err(net("hf"))],
                &[(0, First), (1, First), (0, Resumed)],
                Err(Some(2)),
                &[(0, false), (1, false), (0, false)],
            ),
        ];
        let o = Origins::default();
        let all: Vec<Origin> = o.iter().cloned().collect();
        let index = |x: &Origin| all.iter().position(|y| y == x).unwrap();
        for (what, script, turns, came, notes) in cases {
            let mut script = script.into_iter();
            let mut asked = Vec::new();
            let mut noted = Vec::new();
            let got = first_answer(
                all.clone(),
                |origin, turn| {
                    asked.push((index(origin), turn));
                    script.next().expect("asked once more than scripted")
                },
                |origin, r| noted.push((index(origin), r.is_ok())),
            );
            let got: Came = match got {
                Ok(Tried::Answered { origin, failed, .. }) => Ok((index(&origin), failed.len())),
                Ok(Tried::NoneAnswered(failed)) => {
                    assert!(
                        failed.iter().all(|(_, e)| !e.is_local()),
                        "{what}: {failed:?}"
                    );
                    Err(Some(failed.len()))
                }
                Err(e) => {
                    assert!(e.is_local(), "{what}: {e}");
                    Err(None)
                }
            };
            assert_eq!(got, came, "{what}");
            assert_eq!(asked, turns, "{what}");
            assert_eq!(noted, notes, "{what}");
        }
        // Each failure names its origin, in the order they happened.
        let got = first_answer(
            all.clone(),
            |origin, _| -> Result<()> { Err(net(origin.base())) },
            |_, _| {},
        )
        .unwrap();
        let Tried::NoneAnswered(failed) = got else {
            panic!("answered")
        };
        let names: Vec<String> = all.iter().map(Origin::to_string).collect();
        let origins: Vec<String> = failed.into_iter().map(|(n, _)| n).collect();
        assert_eq!(origins, names);
    }
}
