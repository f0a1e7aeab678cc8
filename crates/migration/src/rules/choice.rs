//! The user's choice, remembered apart from the params modeld reads (`<models>/.choice.json`).
//!
//! The UI writes the user's pick into the selection and profile params; modeld reads the same
//! params. When a chosen model cannot be had, the manager points those params at the built-in,
//! and this record keeps what the user chose, so the fallback is temporary: every later refresh
//! retries the model (with [`backoff`]) and switches back once it verified, offroad. Only a model
//! absent from the catalog is dropped for good.
//!
//! How a pick is told from a fallback: the record also holds what the manager last *wrote* to
//! each slot. A slot whose param still says what we wrote is unchanged by the user, so the
//! remembered choice stands; a slot that says anything else is a new pick. Each slot (selection,
//! small profile, big profile) is judged on its own, so a crash between two param writes cannot
//! turn half a fallback into a "pick".
//!
//! The decisions are pure functions over typed values (table tests below); `manager.rs` does
//! the reading and writing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use manifest::ModelId;
use serde::{Deserialize, Serialize};

use crate::rules::contract::{self, BigOutcome, BigProfile, Catalog, ModelKind, Outcome, Wanted};

/// The record's file in the models dir.
pub const CHOICE_FILE: &str = ".choice.json";

/// The first retry waits this long after a failure; each further failure doubles it.
pub const BACKOFF_BASE: Duration = Duration::from_secs(5 * 60);
/// The longest wait between two retries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(6 * 60 * 60);

/// The three slots a user chooses, as the params name them (ids, lower-cased; `None` unset).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slots {
    pub selection: Option<String>,
    #[serde(default)]
    pub small: Option<String>,
    #[serde(default)]
    pub big: Option<String>,
}

/// A chosen model that could not be had, and when it is tried again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    pub failures: u32,
    /// Unix seconds; a refresh before then does not download it.
    pub next_unix: u64,
    /// Why the last attempt failed (for `status`).
    pub reason: String,
}

/// `.choice.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    /// What the user chose.
    pub wanted: Slots,
    /// What this manager last wrote to the params, slot by slot.
    pub written: Slots,
    /// Chosen catalog models that could not be had (or whose newer version could not), by id.
    #[serde(default)]
    pub retry: BTreeMap<String, Retry>,
    /// Models dropped for good at the last refresh that dropped any (absent from the catalog).
    #[serde(default)]
    pub dropped: BTreeSet<String>,
    /// Set while the params are being rewritten: what they are about to say. A slot saying
    /// this is ours too (see [`staged`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Slots>,
}

/// What the user wants now: per slot, the remembered choice while the param still says what we
/// wrote, else the param (a new pick). Without a record, the params are the choice.
pub fn remember(record: Option<&Choice>, params: &Slots) -> Slots {
    let Some(r) = record else {
        return params.clone();
    };
    let pick = |slot: fn(&Slots) -> &Option<String>| {
        let now = slot(params);
        match now == slot(&r.written) || r.pending.as_ref().map(slot) == Some(now) {
            true => slot(&r.wanted).clone(),
            false => now.clone(),
        }
    };
    Slots {
        selection: pick(|s| &s.selection),
        small: pick(|s| &s.small),
        big: pick(|s| &s.big),
    }
}

/// The record to store before the params are rewritten towards `next` (the record to store
/// after): the new choice, with `written` the params as this refresh read them and `pending`
/// what they are about to say. A crash anywhere between the two stores leaves every slot at
/// one of those two values, both read as "ours", so the choice survives (a fallback, and a
/// switch back, in either direction).
pub fn staged(next: &Choice, params_before: &Slots) -> Choice {
    Choice {
        written: params_before.clone(),
        pending: Some(next.written.clone()),
        ..next.clone()
    }
}

/// The wait before retry number `failures + 1`: 5 min, 10 min, 20 min, … at most 6 h.
pub fn backoff(failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
}

/// Who runs a refresh. The backoff governs only the daemon's own retries: a person who runs
/// `refresh` asks for a try now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The daemon, on its schedule (and when the car goes offroad).
    Daemon,
    /// A person, from the command line: every pending model is tried at once.
    Person,
}

/// Whether a refresh at `now_unix` by `caller` may try to download a model with this retry
/// state: always for a person; for the daemon once its backoff has passed.
pub fn due(retry: Option<&Retry>, now_unix: u64, caller: Caller) -> bool {
    caller == Caller::Person || retry.is_none_or(|r| now_unix >= r.next_unix)
}

/// How soon the daemon refreshes again after a refresh found an origin's files disagreeing with
/// its manifest ("not yet": a store half-way through a republish). No failure is counted and
/// no backoff grows; the store is asked again after this long (or after the daemon's refresh
/// interval, when that is shorter).
pub const NOT_YET_RETRY: Duration = Duration::from_secs(2 * 60);

/// Why a refresh did not have a wanted catalog model, and whether that counts toward its backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Its download was tried and failed: one more failure, the backoff grows.
    Tried(String),
    /// Not tried (the backoff not due, held back by the byte budget, failed to start, no
    /// Chestnut): no failure is counted.
    NotTried(String),
}

/// What became of one wanted model in a refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Verified for the catalog's digest (or built-in, or a present local model).
    Ok,
    /// A verified copy of an earlier publish in this generation is in use; the catalog's newer
    /// bytes could not be had yet and are retried.
    OldCopyInUse(Failure),
    /// In the catalog but could not be had: the built-in stands in, and it is retried.
    Temporary(Failure),
    /// Not in the catalog: dropped for good.
    Dropped,
}

/// The fate of a wanted model: `available` after the installs, `old_copy` when a verified copy
/// of an earlier publish is there, `failure` the reason this refresh could not install it
/// (or why it was not tried).
pub fn fate(
    id: &ModelId,
    catalog: &Catalog,
    available: bool,
    old_copy: bool,
    failure: Option<Failure>,
) -> Fate {
    if contract::kind(id) == ModelKind::BuiltIn {
        return Fate::Ok;
    }
    if !catalog.contains(id) {
        return Fate::Dropped;
    }
    match (available, old_copy, failure) {
        (true, _, None) => Fate::Ok,
        (_, true, Some(f)) => Fate::OldCopyInUse(f),
        (true, false, Some(_)) => Fate::Ok,
        (false, _, f) => {
            Fate::Temporary(f.unwrap_or_else(|| Failure::NotTried("not installed".into())))
        }
    }
}

/// The slots as written by `o` (ids; the big profile `none` when disabled, `None` when unset).
pub fn written_slots(o: &Outcome) -> Slots {
    Slots {
        selection: Some(o.selection.id.to_string()),
        small: Some(o.small.id.to_string()),
        big: match &o.big {
            BigOutcome::Unset => None,
            BigOutcome::Disabled => Some(contract::BIG_DISABLED.to_string()),
            BigOutcome::Model(n) => Some(n.id.to_string()),
        },
    }
}

/// The record after a refresh: a slot whose model was dropped for good takes what was written
/// (the fallback becomes the choice); every other slot keeps the user's choice. Retries: a
/// model whose download failed this time counts one more failure and waits [`backoff`]; one not
/// tried (the backoff skipped it, or the daily byte budget held it back) keeps its schedule, or
/// has none; a model that is fine or dropped, or no longer wanted,
/// leaves the list.
pub fn after_refresh(
    prev: Option<&Choice>,
    wanted_slots: &Slots,
    wanted: &Wanted,
    fates: &BTreeMap<ModelId, Fate>,
    written: &Slots,
    now_unix: u64,
) -> Choice {
    let dropped = |id: &ModelId| matches!(fates.get(id), Some(Fate::Dropped));
    let mut slots = wanted_slots.clone();
    if dropped(&wanted.selection) {
        slots.selection = written.selection.clone();
    }
    if dropped(&wanted.profiles.small) {
        slots.small = written.small.clone();
    }
    if let BigProfile::Model(b) = &wanted.profiles.big
        && dropped(b)
    {
        slots.big = written.big.clone();
    }
    let mut retry = BTreeMap::new();
    for (id, f) in fates {
        let failure = match f {
            Fate::Temporary(f) | Fate::OldCopyInUse(f) => f,
            Fate::Ok | Fate::Dropped => continue,
        };
        let before = prev.and_then(|p| p.retry.get(id.as_str()));
        let r = match (failure, before) {
            (Failure::NotTried(_), Some(b)) => b.clone(),
            // Not tried (held back by the daily byte budget): no failure, no backoff.
            (Failure::NotTried(_), None) => continue,
            (Failure::Tried(reason), _) => {
                let failures = before.map_or(0, |b| b.failures).saturating_add(1);
                Retry {
                    failures,
                    next_unix: now_unix.saturating_add(backoff(failures).as_secs()),
                    reason: reason.clone(),
                }
            }
        };
        retry.insert(id.to_string(), r);
    }
    let newly_dropped: BTreeSet<String> = fates
        .iter()
        .filter(|(_, f)| **f == Fate::Dropped)
        .map(|(id, _)| id.to_string())
        .collect();
    Choice {
        wanted: slots,
        written: written.clone(),
        retry,
        dropped: if newly_dropped.is_empty() {
            prev.map(|p| p.dropped.clone()).unwrap_or_default()
        } else {
            newly_dropped
        },
        pending: None,
    }
}

/// While the car is onroad, a refresh does not move a slot from its stand-in back to the chosen
/// model (modeld would pick the change up mid-drive on its next start); the switch waits for the
/// first refresh offroad. Falling back (to the built-in) is never held: a model that is not
/// there must not be named.
pub fn hold_onroad(
    next: Outcome,
    current: &Slots,
    record: Option<&Choice>,
    catalog: &Catalog,
) -> Outcome {
    let Some(r) = record else { return next };
    let in_fallback = |w: &Option<String>, cur: &Option<String>| w != cur;
    let mut o = next;
    let builtin = catalog.builtin();
    let slots = [
        (
            &r.wanted.selection,
            &r.written.selection,
            &current.selection,
            &mut o.selection,
        ),
        (
            &r.wanted.small,
            &r.written.small,
            &current.small,
            &mut o.small,
        ),
    ];
    for (wanted, written, now, slot) in slots {
        if in_fallback(wanted, written)
            && now.as_deref() == Some(builtin.id.as_str())
            && slot.id != builtin.id
        {
            *slot = builtin.clone();
        }
    }
    if in_fallback(&r.wanted.big, &r.written.big)
        && current.big.is_none()
        && matches!(o.big, BigOutcome::Model(_))
    {
        o.big = BigOutcome::Unset;
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::contract::{ProfilesRead, SelectionParams};
    use manifest::Manifest;
    use serde_json::json;

    fn s(sel: &str, small: Option<&str>, big: Option<&str>) -> Slots {
        Slots {
            selection: Some(sel.into()),
            small: small.map(String::from),
            big: big.map(String::from),
        }
    }

    fn id(x: &str) -> ModelId {
        x.parse().unwrap()
    }

    fn catalog() -> Catalog {
        let m = Manifest::from_value(json!({"models": [
            {"id": "rdf43", "name": "RDF", "version": "v15"},
            {"id": "pop223", "name": "Pop", "version": "v16"},
            {"id": "big1", "name": "Big", "version": "v16", "uses_external_gpu": true},
        ]}))
        .unwrap();
        Catalog::new(&m, &[])
    }

    #[test]
    fn a_slot_still_saying_what_we_wrote_keeps_the_choice_any_other_value_is_a_pick() {
        let rec = Choice {
            wanted: s("pop223", Some("pop223"), Some("big1")),
            written: s("rdf43", Some("rdf43"), None),
            ..Choice::default()
        };
        for (params, want) in [
            // Untouched fallback: the choice stands.
            (
                s("rdf43", Some("rdf43"), None),
                s("pop223", Some("pop223"), Some("big1")),
            ),
            // A crash between writes: the selection written, the small profile not yet.
            (
                s("rdf43", Some("pop223"), Some("big1")),
                s("pop223", Some("pop223"), Some("big1")),
            ),
            // The user picked another model: that is the choice now.
            (
                s("tr14223", Some("rdf43"), None),
                s("tr14223", Some("pop223"), Some("big1")),
            ),
            // The user disabled the big profile.
            (
                s("rdf43", Some("rdf43"), Some("none")),
                s("pop223", Some("pop223"), Some("none")),
            ),
        ] {
            assert_eq!(remember(Some(&rec), &params), want, "{params:?}");
        }
        let p = s("pop223", None, None);
        assert_eq!(remember(None, &p), p);

        // Switching back from the built-in: the staged record is stored before the params.
        let next = Choice {
            wanted: s("pop223", None, None),
            written: s("pop223", Some("pop223"), None),
            ..Choice::default()
        };
        let before = s("rdf43", Some("rdf43"), None);
        let st = staged(&next, &before);
        for params in [
            before.clone(),                    // crashed before any param write
            s("pop223", Some("rdf43"), None),  // between two writes
            s("pop223", Some("pop223"), None), // after the last write
        ] {
            assert_eq!(remember(Some(&st), &params), next.wanted, "{params:?}");
        }
        // A pick of a third model is still a pick.
        assert_eq!(
            remember(Some(&st), &s("tr14223", Some("rdf43"), None))
                .selection
                .as_deref(),
            Some("tr14223")
        );
    }

    #[test]
    fn backoff_doubles_from_five_minutes_to_six_hours() {
        let mins: Vec<u64> = [1, 2, 3, 4, 5, 6, 7, 8, 40]
            .map(|f| backoff(f).as_secs() / 60)
            .into();
        assert_eq!(mins, [5, 10, 20, 40, 80, 160, 320, 360, 360]);
        let r = Retry {
            failures: 1,
            next_unix: 100,
            reason: String::new(),
        };
        // (retry, now, caller) -> due: the backoff holds the daemon only; a person's
        // `refresh` tries at once. For v25's models and a next generation's alike (the rule
        // does not read the generation).
        for (retry, now, caller, want) in [
            (Some(&r), 99, Caller::Daemon, false),
            (Some(&r), 100, Caller::Daemon, true),
            (None, 0, Caller::Daemon, true),
            (Some(&r), 99, Caller::Person, true),
            (Some(&r), 0, Caller::Person, true),
            (None, 0, Caller::Person, true),
        ] {
            assert_eq!(
                due(retry, now, caller),
                want,
                "{retry:?} at {now} by {caller:?}"
            );
        }
    }

    #[test]
    fn fates_table() {
        let c = catalog();
        let fail = || Some(Failure::Tried("404".to_string()));
        for (m, avail, old, failure, want) in [
            ("rdf43", false, false, None, Fate::Ok),
            ("pop223", true, false, None, Fate::Ok),
            ("gone", false, false, fail(), Fate::Dropped),
            (
                "pop223",
                false,
                false,
                fail(),
                Fate::Temporary(Failure::Tried("404".into())),
            ),
            (
                "pop223",
                true,
                true,
                fail(),
                Fate::OldCopyInUse(Failure::Tried("404".into())),
            ),
            (
                "pop223",
                false,
                false,
                None,
                Fate::Temporary(Failure::NotTried("not installed".into())),
            ),
        ] {
            assert_eq!(
                fate(&id(m), &c, avail, old, failure.clone()),
                want,
                "{m} {avail} {old} {failure:?}"
            );
        }
    }

    #[test]
    fn after_a_refresh_temporary_failures_are_retried_and_absent_models_dropped() {
        let c = catalog();
        let wanted_slots = s("pop223", None, Some("gone"));
        let w = contract::wanted(
            &SelectionParams {
                model: Some("pop223".into()),
                driving_model: Some("pop223".into()),
                ..Default::default()
            },
            &ProfilesRead {
                small: None,
                big: Some("gone".into()),
            },
            &c,
        );
        let written = s("rdf43", Some("rdf43"), None);
        let mut fates = BTreeMap::new();
        fates.insert(id("pop223"), Fate::Temporary(Failure::Tried("404".into())));
        fates.insert(id("gone"), Fate::Dropped);
        let r1 = after_refresh(None, &wanted_slots, &w, &fates, &written, 1000);
        assert_eq!(
            r1.wanted,
            s("pop223", None, None),
            "gone dropped for good, pop223 kept"
        );
        assert_eq!(
            r1.retry["pop223"],
            Retry {
                failures: 1,
                next_unix: 1300,
                reason: "404".into()
            }
        );
        assert_eq!(r1.dropped, BTreeSet::from(["gone".to_string()]));

        // Skipped by the backoff: the schedule stays. Tried and failed again: doubled.
        fates.insert(id("pop223"), Fate::Temporary(Failure::NotTried("x".into())));
        let r2 = after_refresh(Some(&r1), &r1.wanted, &w, &fates, &written, 1100);
        assert_eq!(r2.retry["pop223"], r1.retry["pop223"]);
        fates.insert(id("pop223"), Fate::Temporary(Failure::Tried("503".into())));
        let r3 = after_refresh(Some(&r2), &r2.wanted, &w, &fates, &written, 1300);
        assert_eq!(
            r3.retry["pop223"],
            Retry {
                failures: 2,
                next_unix: 1900,
                reason: "503".into()
            }
        );

        // Verified at last: the retry is gone, the choice unchanged.
        fates.insert(id("pop223"), Fate::Ok);
        fates.remove(&id("gone"));
        let r4 = after_refresh(
            Some(&r3),
            &r3.wanted,
            &w,
            &fates,
            &s("pop223", Some("pop223"), None),
            2000,
        );
        assert!(r4.retry.is_empty());
        assert_eq!(r4.wanted, s("pop223", None, None));
        assert_eq!(r4.dropped, r1.dropped, "the last drop stays on record");

        // Not tried with no schedule before (held back by the daily byte budget): still
        // pending, but no failure counted and no backoff started.
        fates.insert(
            id("pop223"),
            Fate::Temporary(Failure::NotTried("held back".into())),
        );
        let r5 = after_refresh(Some(&r4), &r4.wanted, &w, &fates, &written, 2100);
        assert!(r5.retry.is_empty(), "{:?}", r5.retry);
        assert_eq!(r5.wanted, s("pop223", None, None));
    }

    #[test]
    fn onroad_a_switch_back_waits_but_a_fallback_does_not() {
        let c = catalog();
        let rec = Choice {
            wanted: s("pop223", None, None),
            written: s("rdf43", Some("rdf43"), None),
            ..Choice::default()
        };
        let pop = Outcome {
            selection: c.named(&id("pop223")),
            small: c.named(&id("pop223")),
            big: BigOutcome::Unset,
            fell_back: false,
        };
        let current = s("rdf43", Some("rdf43"), None);
        let held = hold_onroad(pop.clone(), &current, Some(&rec), &c);
        assert_eq!(held.selection.id.as_str(), "rdf43");
        assert_eq!(held.small.id.as_str(), "rdf43");
        // Not in a fallback (a plain pick): nothing is held.
        let plain = Choice {
            wanted: current.clone(),
            written: current.clone(),
            ..Choice::default()
        };
        assert_eq!(hold_onroad(pop.clone(), &current, Some(&plain), &c), pop);
        // Falling back is never held.
        let builtin = Outcome {
            selection: c.builtin(),
            small: c.builtin(),
            big: BigOutcome::Unset,
            fell_back: true,
        };
        let on_pop = s("pop223", Some("pop223"), None);
        assert_eq!(
            hold_onroad(builtin.clone(), &on_pop, Some(&rec), &c),
            builtin
        );
    }
}
