//! Generation ↔ tinygrad pin: one manifest generation is one tinygrad ABI.
//!
//! The table starts from the pins this code knows ([`PinTable::builtin`]: v25 →
//! `e837e367…`) and grows through `tinygrad bump`, which records each new generation's pin in
//! the openpilot tree ([`PINS_FILE`], `{"v25": "<sha>", "v26": "<sha>"}`), so the pair lives
//! in the repository and not only on a command line. [`check_pin`] is the rule publish applies:
//! the manifest's `tinygrad_commit` must be its generation's pin, and no two generations may
//! share a pin ([`PinTable::record`] refuses that when the pair is written).

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::layout::{CURRENT_GENERATION, current_tinygrad_commit};
use crate::types::{Generation, GitCommit};

/// Where `tinygrad bump` records the table, relative to the openpilot tree.
pub const PINS_FILE: &str = "tinygrad_pins.json";

/// Generations and their tinygrad pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinTable {
    pins: BTreeMap<Generation, GitCommit>,
}

impl Default for PinTable {
    fn default() -> Self {
        Self::builtin()
    }
}

/// Why a pin table cannot take a pair, or why a manifest's pin is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinRefusal {
    /// The manifest does not say which tinygrad it was built with.
    Missing { generation: Generation },
    /// No pin is recorded for the generation.
    Unknown { generation: Generation },
    /// The manifest's pin is not its generation's.
    Mismatch {
        generation: Generation,
        expected: GitCommit,
        found: GitCommit,
        /// The generation `found` is the pin of, when it is one.
        belongs_to: Option<Generation>,
    },
    /// Recording a pin already used by another generation.
    Reused {
        generation: Generation,
        commit: GitCommit,
        owner: Generation,
    },
    /// Recording a different pin for a generation that has one.
    Conflict {
        generation: Generation,
        recorded: GitCommit,
        new: GitCommit,
    },
}

impl fmt::Display for PinRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { generation } => write!(
                f,
                "the manifest has no tinygrad_commit; every {generation} manifest records the tinygrad pin its artifacts were compiled with"
            ),
            Self::Unknown { generation } => write!(
                f,
                "no tinygrad pin is recorded for {generation}; run `release-cli tinygrad bump --openpilot DIR --tinygrad-src TINYGRAD` for it (DIR: the openpilot checkout; TINYGRAD: a tinygrad tree at the new pin; it records the pair in DIR/{PINS_FILE}) and pass --openpilot DIR"
            ),
            Self::Mismatch {
                generation,
                expected,
                found,
                belongs_to,
            } => {
                write!(
                    f,
                    "the manifest's tinygrad_commit {found} is not {generation}'s pin {expected}"
                )?;
                if let Some(g) = belongs_to {
                    write!(
                        f,
                        " (it is {g}'s: a {g} manifest cannot be published as {generation}, and its artifacts target another ABI)"
                    )?;
                }
                Ok(())
            }
            Self::Reused {
                generation,
                commit,
                owner,
            } => write!(
                f,
                "tinygrad {commit} is already {owner}'s pin; a new generation ({generation}) needs a new tinygrad commit (same pin means same ABI: keep publishing {owner})"
            ),
            Self::Conflict {
                generation,
                recorded,
                new,
            } => write!(
                f,
                "{generation} is already pinned to tinygrad {recorded}, not {new}; a pin never changes within a generation: bump to the next generation instead"
            ),
        }
    }
}

impl std::error::Error for PinRefusal {}

impl PinTable {
    /// The pins this code was released with.
    pub fn builtin() -> Self {
        let mut pins = BTreeMap::new();
        pins.insert(CURRENT_GENERATION, current_tinygrad_commit());
        Self { pins }
    }

    pub fn get(&self, generation: Generation) -> Option<&GitCommit> {
        self.pins.get(&generation)
    }

    /// The generation whose pin is `commit`.
    pub fn owner_of(&self, commit: &GitCommit) -> Option<Generation> {
        self.pins
            .iter()
            .find(|(_, c)| *c == commit)
            .map(|(g, _)| *g)
    }

    pub fn iter(&self) -> impl Iterator<Item = (Generation, &GitCommit)> {
        self.pins.iter().map(|(g, c)| (*g, c))
    }

    /// Add `generation → commit`. Recording the same pair again is a no-op; a different pin
    /// for a pinned generation, or a pin another generation has, is refused.
    pub fn record(
        &mut self,
        generation: Generation,
        commit: &GitCommit,
    ) -> Result<bool, PinRefusal> {
        if let Some(recorded) = self.pins.get(&generation) {
            return if recorded == commit {
                Ok(false)
            } else {
                Err(PinRefusal::Conflict {
                    generation,
                    recorded: recorded.clone(),
                    new: commit.clone(),
                })
            };
        }
        if let Some(owner) = self.owner_of(commit) {
            return Err(PinRefusal::Reused {
                generation,
                commit: commit.clone(),
                owner,
            });
        }
        self.pins.insert(generation, commit.clone());
        Ok(true)
    }

    /// Merge a recorded table (`{"v25": "<sha>", …}`) into this one, with [`PinTable::record`]'s
    /// rules. `Err` is a message naming the bad key or value.
    pub fn merge_json(&mut self, bytes: &[u8]) -> Result<(), String> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let Value::Object(map) = value else {
            return Err("expected an object {\"vNN\": \"<40-hex tinygrad commit>\"}".into());
        };
        for (k, v) in map {
            let generation: Generation = k.parse().map_err(|e| format!("key {k:?}: {e}"))?;
            let commit: GitCommit = v
                .as_str()
                .ok_or_else(|| format!("{k}: expected a commit string"))?
                .parse()
                .map_err(|e| format!("{k}: {e}"))?;
            self.record(generation, &commit)
                .map_err(|e| format!("{k}: {e}"))?;
        }
        Ok(())
    }

    /// The table as `tinygrad bump` writes it: one key per generation, in order, newline-ended.
    pub fn to_json(&self) -> String {
        let map: Map<String, Value> = self
            .pins
            .iter()
            .map(|(g, c)| (g.to_string(), Value::String(c.to_string())))
            .collect();
        serde_json::to_string_pretty(&Value::Object(map)).expect("strings serialize") + "\n"
    }
}

/// The pin rule: `manifest_pin` must be present and be `generation`'s recorded pin.
pub fn check_pin(
    table: &PinTable,
    generation: Generation,
    manifest_pin: Option<&GitCommit>,
) -> Result<(), PinRefusal> {
    let found = manifest_pin.ok_or(PinRefusal::Missing { generation })?;
    let expected = table
        .get(generation)
        .ok_or(PinRefusal::Unknown { generation })?;
    if found == expected {
        return Ok(());
    }
    Err(PinRefusal::Mismatch {
        generation,
        expected: expected.clone(),
        found: found.clone(),
        belongs_to: table.owner_of(found),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(ch: char) -> GitCommit {
        ch.to_string().repeat(40).parse().unwrap()
    }

    #[test]
    fn the_pin_rule() {
        let v25 = Generation::new(25);
        let v26 = Generation::new(26);
        let mut t = PinTable::builtin();
        t.record(v26, &c('a')).unwrap();
        let pin25 = current_tinygrad_commit();
        let cases: Vec<(Generation, Option<GitCommit>, Result<(), PinRefusal>)> = vec![
            (v25, Some(pin25.clone()), Ok(())),
            (v26, Some(c('a')), Ok(())),
            (v25, None, Err(PinRefusal::Missing { generation: v25 })),
            (
                Generation::new(27),
                Some(c('b')),
                Err(PinRefusal::Unknown {
                    generation: Generation::new(27),
                }),
            ),
            // --generation v26 with a v25-pinned manifest.
            (
                v26,
                Some(pin25.clone()),
                Err(PinRefusal::Mismatch {
                    generation: v26,
                    expected: c('a'),
                    found: pin25.clone(),
                    belongs_to: Some(v25),
                }),
            ),
            (
                v25,
                Some(c('f')),
                Err(PinRefusal::Mismatch {
                    generation: v25,
                    expected: pin25.clone(),
                    found: c('f'),
                    belongs_to: None,
                }),
            ),
        ];
        for (g, pin, want) in cases {
            assert_eq!(check_pin(&t, g, pin.as_ref()), want, "{g} {pin:?}");
        }
    }

    #[test]
    fn recording_pairs() {
        let v25 = Generation::new(25);
        let v26 = Generation::new(26);
        let mut t = PinTable::builtin();
        assert_eq!(t.record(v25, &current_tinygrad_commit()), Ok(false));
        // A new generation with the old pin.
        assert!(matches!(
            t.record(v26, &current_tinygrad_commit()),
            Err(PinRefusal::Reused { owner, .. }) if owner == v25
        ));
        assert!(matches!(
            t.record(v25, &c('a')),
            Err(PinRefusal::Conflict { .. })
        ));
        assert_eq!(t.record(v26, &c('a')), Ok(true));
        let json = t.to_json();
        let mut back = PinTable::builtin();
        back.merge_json(json.as_bytes()).unwrap();
        assert_eq!(back, t);
        assert!(
            PinTable::builtin()
                .merge_json(br#"{"v25": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#)
                .unwrap_err()
                .contains("already pinned")
        );
        assert!(PinTable::builtin().merge_json(b"[]").is_err());
    }
}
