//! Generation ↔ tinygrad pin: one manifest generation is one tinygrad ABI.
//!
//! The table starts from the pins this code knows ([`PinTable::builtin`]: v25 →
//! `e837e367…`) and grows through `tinygrad bump`, which records each new generation's pin in
//! the openpilot tree ([`PINS_FILE`], `{"v25": "<sha>", "v26": "<sha>"}`), so the pair lives
//! in the repository and not only on a command line. [`check_pin`] is the rule publish applies:
//! the manifest's `tinygrad_commit` must be its generation's pin, and no two generations may
//! share a pin ([`PinTable::record`] refuses that when the pair is written).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::contract::{BASE_CONTRACT, Contract, ContractName, TreeDeclaration};
use crate::layout::{CURRENT_GENERATION, current_tinygrad_commit};
use crate::types::{Generation, GitCommit};

/// Where `tinygrad bump` records the table, relative to the openpilot tree.
pub const PINS_FILE: &str = "tinygrad_pins.json";

/// Generations and their tinygrad pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinTable {
    pins: BTreeMap<Generation, GitCommit>,
    /// Contracts recorded for a generation; the others inherit ([`PinTable::contract_of`]).
    contracts: BTreeMap<Generation, ContractName>,
}

impl Default for PinTable {
    fn default() -> Self {
        Self::builtin()
    }
}

/// Why a pin table cannot take a pair, or why a manifest's pin is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinRefusal {
    /// The manifest does not say which tinygrad it was built with.
    #[error(
        "the manifest has no tinygrad_commit; every {generation} manifest records the tinygrad pin its artifacts were compiled with"
    )]
    Missing {
        /// The manifest's generation.
        generation: Generation,
    },
    /// No pin is recorded for the generation.
    #[error(
        "no tinygrad pin is recorded for {generation}; run `release-cli tinygrad bump --openpilot DIR --tinygrad-src TINYGRAD` for it (DIR: the openpilot checkout; TINYGRAD: a tinygrad tree at the new pin; it records the pair in DIR/{PINS_FILE}) and pass --openpilot DIR"
    )]
    Unknown {
        /// The generation.
        generation: Generation,
    },
    /// The manifest's pin is not its generation's.
    #[error("the manifest's tinygrad_commit {found} is not {generation}'s pin {expected}{}", belongs(*.belongs_to, *.generation))]
    Mismatch {
        /// The manifest's generation.
        generation: Generation,
        /// The pin recorded for it.
        expected: GitCommit,
        /// The manifest's `tinygrad_commit`.
        found: GitCommit,
        /// The generation `found` is the pin of, when it is one.
        belongs_to: Option<Generation>,
    },
    /// Recording a pin already used by another generation.
    #[error(
        "tinygrad {commit} is already {owner}'s pin; a new generation ({generation}) needs a new tinygrad commit (same pin means same ABI: keep publishing {owner})"
    )]
    Reused {
        /// The generation being recorded.
        generation: Generation,
        /// The commit offered as its pin.
        commit: GitCommit,
        /// The generation that already has it.
        owner: Generation,
    },
    /// Recording a different contract for a generation that has one.
    #[error(
        "{generation} is already recorded as a {recorded}-contract generation, not {new}; a generation's contract never changes: bump to the next generation instead"
    )]
    ContractConflict {
        /// The generation.
        generation: Generation,
        /// The contract recorded for it.
        recorded: ContractName,
        /// The contract offered.
        new: ContractName,
    },
    /// Recording a different pin for a generation that has one.
    #[error(
        "{generation} is already pinned to tinygrad {recorded}, not {new}; a pin never changes within a generation: bump to the next generation instead"
    )]
    Conflict {
        /// The generation.
        generation: Generation,
        /// The pin recorded for it.
        recorded: GitCommit,
        /// The pin offered.
        new: GitCommit,
    },
}

/// What a pin that is another generation's adds to [`PinRefusal::Mismatch`].
fn belongs(owner: Option<Generation>, generation: Generation) -> String {
    owner.map_or_else(String::new, |g| {
        format!(
            " (it is {g}'s: a {g} manifest cannot be published as {generation}, and its artifacts \
             target another ABI)"
        )
    })
}

impl PinTable {
    /// The pins this code was released with.
    pub fn builtin() -> Self {
        let mut pins = BTreeMap::new();
        pins.insert(CURRENT_GENERATION, current_tinygrad_commit());
        let mut contracts = BTreeMap::new();
        contracts.insert(CURRENT_GENERATION, ContractName::V25);
        Self { pins, contracts }
    }

    /// The contract `generation` runs: the one recorded for it, else the one of the nearest
    /// earlier generation with a recorded contract, else [`BASE_CONTRACT`]. A made-up v27 after
    /// a v26-contract v26 is therefore a v26-contract generation.
    pub fn contract_of(&self, generation: Generation) -> ContractName {
        self.contracts
            .range(..=generation)
            .next_back()
            .map(|(_, c)| *c)
            .unwrap_or(BASE_CONTRACT)
    }

    /// The contract recorded for `generation` itself, `None` when it would only inherit one.
    pub fn recorded_contract(&self, generation: Generation) -> Option<ContractName> {
        self.contracts.get(&generation).copied()
    }

    /// [`PinTable::contract_of`]'s table row.
    pub fn contract(&self, generation: Generation) -> &'static Contract {
        self.contract_of(generation).contract()
    }

    /// Record that `generation` runs `contract`. Recording the same pair again is a no-op; a
    /// different contract for a generation that has one recorded is refused.
    pub fn record_contract(
        &mut self,
        generation: Generation,
        contract: ContractName,
    ) -> Result<bool, PinRefusal> {
        match self.contracts.get(&generation) {
            Some(c) if *c == contract => Ok(false),
            Some(c) => Err(PinRefusal::ContractConflict {
                generation,
                recorded: *c,
                new: contract,
            }),
            None => {
                self.contracts.insert(generation, contract);
                Ok(true)
            }
        }
    }

    /// Take what a tree declares (upstream's v26 catalog module): its generation's pin and
    /// contract, with [`PinTable::record`]'s rules.
    pub fn declare(&mut self, tree: &TreeDeclaration) -> Result<(), PinRefusal> {
        self.record(tree.generation, &tree.compiler_revision)?;
        self.record_contract(tree.generation, tree.contract)?;
        Ok(())
    }

    /// The pin of `generation`, when one is recorded.
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

    /// Every `(generation, pin)`, by generation.
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

    /// Merge a recorded table into this one, with [`PinTable::record`]'s rules. A value is a
    /// pin (`{"v25": "<sha>"}`) or a pin and a contract (`{"v26": {"tinygrad": "<sha>",
    /// "contract": "v26"}}`). `Err` is a message naming the bad key or value.
    pub fn merge_json(&mut self, bytes: &[u8]) -> Result<(), String> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let Value::Object(map) = value else {
            return Err("expected an object {\"vNN\": \"<40-hex tinygrad commit>\"}".into());
        };
        for (k, v) in map {
            let generation: Generation = k.parse().map_err(|e| format!("key {k:?}: {e}"))?;
            let (commit, contract) = match &v {
                Value::String(s) => (s.as_str(), None),
                Value::Object(o) => {
                    if let Some(extra) = o
                        .keys()
                        .find(|k| !["tinygrad", "contract"].contains(&k.as_str()))
                    {
                        return Err(format!(
                            "{k}: unknown key {extra:?} (expected tinygrad, contract)"
                        ));
                    }
                    let commit = o
                        .get("tinygrad")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("{k}: expected a \"tinygrad\" commit string"))?;
                    let contract = match o.get("contract") {
                        None => None,
                        Some(c) => Some(
                            c.as_str()
                                .ok_or_else(|| format!("{k}.contract: expected a string"))?
                                .parse::<ContractName>()
                                .map_err(|e| format!("{k}.contract: {e}"))?,
                        ),
                    };
                    (commit, contract)
                }
                _ => return Err(format!("{k}: expected a commit string")),
            };
            let commit: GitCommit = commit.parse().map_err(|e| format!("{k}: {e}"))?;
            self.record(generation, &commit)
                .map_err(|e| format!("{k}: {e}"))?;
            if let Some(c) = contract {
                self.record_contract(generation, c)
                    .map_err(|e| format!("{k}: {e}"))?;
            }
        }
        Ok(())
    }

    /// The table as `tinygrad bump` writes it: one key per generation, in order, newline-ended;
    /// a generation with a recorded contract other than the one it would inherit is written
    /// with it (`{"tinygrad": …, "contract": …}`).
    pub fn to_json(&self) -> String {
        let map: Map<String, Value> = self
            .pins
            .iter()
            .map(|(g, c)| {
                let inherited = g
                    .previous()
                    .map(|p| self.contract_of(p))
                    .unwrap_or(BASE_CONTRACT);
                let value = match self.contracts.get(g) {
                    Some(k) if *k != inherited => {
                        serde_json::json!({"tinygrad": c.to_string(), "contract": k.to_string()})
                    }
                    _ => Value::String(c.to_string()),
                };
                (g.to_string(), value)
            })
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

    #[test]
    fn contracts_are_recorded_and_inherited() {
        let (v25, v26, v27, v28) = (
            Generation::new(25),
            Generation::new(26),
            Generation::new(27),
            Generation::new(28),
        );
        let mut t = PinTable::builtin();
        // Nothing recorded after v25: every later generation is a v25-contract one.
        assert_eq!(t.contract_of(v27), ContractName::V25);
        assert_eq!(t.contract_of(Generation::new(3)), ContractName::V25);
        t.record(v26, &c('a')).unwrap();
        t.record_contract(v26, ContractName::V26).unwrap();
        t.record(v27, &c('b')).unwrap();
        let cases = [
            (v25, ContractName::V25),
            (v26, ContractName::V26),
            (v27, ContractName::V26),
            (v28, ContractName::V26),
        ];
        for (g, want) in cases {
            assert_eq!(t.contract_of(g), want, "{g}");
        }
        assert!(matches!(
            t.record_contract(v26, ContractName::V25),
            Err(PinRefusal::ContractConflict { .. })
        ));
        // Written with the contract where it changes, and read back the same.
        let json = t.to_json();
        assert!(json.contains("\"contract\": \"v26\""), "{json}");
        assert_eq!(json.matches("contract").count(), 1, "{json}");
        let mut back = PinTable::builtin();
        back.merge_json(json.as_bytes()).unwrap();
        assert_eq!(back.contract_of(v27), ContractName::V26);
        assert_eq!(back.get(v27), Some(&c('b')));
        // An explicit return to v25 for a v28 is kept.
        back.record(v28, &c('d')).unwrap();
        back.record_contract(v28, ContractName::V25).unwrap();
        let mut again = PinTable::builtin();
        again.merge_json(back.to_json().as_bytes()).unwrap();
        assert_eq!(again.contract_of(v28), ContractName::V25);
        for bad in [
            &br#"{"v26": {"tinygrad": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "contract": "v99"}}"#[..],
            br#"{"v26": {"contract": "v26"}}"#,
            br#"{"v26": {"tinygrad": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abi": "x"}}"#,
            br#"{"v26": 5}"#,
        ] {
            assert!(PinTable::builtin().merge_json(bad).is_err());
        }
    }

    #[test]
    fn a_tree_declaration_records_pin_and_contract() {
        let mut t = PinTable::builtin();
        let decl = TreeDeclaration {
            generation: Generation::new(26),
            contract: ContractName::V26,
            compiler_revision: c('9'),
            catalog: vec![],
        };
        t.declare(&decl).unwrap();
        assert_eq!(t.owner_of(&c('9')), Some(Generation::new(26)));
        assert_eq!(t.contract_of(Generation::new(26)), ContractName::V26);
        // The same declaration again is fine; another pin for v26 is a conflict.
        t.declare(&decl).unwrap();
        let other = TreeDeclaration {
            compiler_revision: c('8'),
            ..decl
        };
        assert!(t.declare(&other).is_err());
    }
}
