//! The generation guard where no store holds the previous generation's manifest (a first
//! publish into a fresh store): the manifest is compared with what the release machine has
//! instead. Under a contract whose entries are the tree's catalog rows (v26), that is the tree's
//! reviewed catalog, and a manifest may list only some of its rows (upstream accepts partial
//! manifests): each row left out is named as staying unpublished. Under a whole-manifest
//! contract (v25), it is the previous generation's manifest the workspace staged, and a model it
//! has that the new one leaves out is refused unless named with `--drop-model ID`. Pure.

use std::collections::BTreeSet;

use manifest::{Contract, Manifest, ModelId};

/// What a publish into stores without the previous generation is told about models it leaves
/// out of `reference` (the tree's catalog ids, or the previous staged manifest's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftOut {
    /// Nothing left out, or every model left out named with `--drop-model`.
    None,
    /// Catalog models the manifest does not list: they stay unpublished (partial manifests).
    StayUnpublished(Vec<ModelId>),
    /// Previous-generation models the manifest drops without `--drop-model`: refused.
    Refused(Vec<ModelId>),
}

/// The models of `reference` (device-local ids aside) that `manifest` does not list, judged by
/// `contract`: listed as staying unpublished where manifests may be partial, else refused unless
/// in `dropped`.
pub fn left_out<'a>(
    contract: &Contract,
    reference: impl IntoIterator<Item = &'a ModelId>,
    manifest: &Manifest,
    dropped: &BTreeSet<ModelId>,
) -> LeftOut {
    let listed: BTreeSet<&ModelId> = manifest.ids().collect();
    let missing = reference
        .into_iter()
        .filter(|id| !id.is_local() && !listed.contains(id));
    if contract.entries_from_tree_catalog {
        let ids: Vec<ModelId> = missing.cloned().collect();
        if ids.is_empty() {
            LeftOut::None
        } else {
            LeftOut::StayUnpublished(ids)
        }
    } else {
        let ids: Vec<ModelId> = missing
            .filter(|id| !dropped.contains(*id))
            .cloned()
            .collect();
        if ids.is_empty() {
            LeftOut::None
        } else {
            LeftOut::Refused(ids)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::{Generation, PinTable};

    fn ids(list: &[&str]) -> Vec<ModelId> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn manifest_of(list: &[&str]) -> Manifest {
        let models: Vec<serde_json::Value> = list
            .iter()
            .map(|id| serde_json::json!({"id": id, "name": id, "version": "v15"}))
            .collect();
        Manifest::from_value(serde_json::json!({ "models": models })).unwrap()
    }

    /// v25 (whole manifest) refuses a left-out model unless dropped; v26 (entries from the
    /// tree's catalog) and a made-up v27 inheriting its contract list it as staying unpublished,
    /// `--drop-model` or not. Device-local ids are never compared.
    #[test]
    fn a_left_out_model_is_refused_only_under_a_whole_manifest_contract() {
        let mut pins = PinTable::builtin();
        pins.record_contract(Generation::new(26), manifest::ContractName::V26)
            .unwrap();
        let reference = ids(&["pop", "gwm", "local-x"]);
        for generation in [25, 26, 27] {
            let contract = pins.contract(Generation::new(generation));
            let partial = generation >= 26;
            assert_eq!(contract.entries_from_tree_catalog, partial, "v{generation}");
            // (listed, dropped, refused under v25, staying unpublished under v26 and v27)
            type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], &'a [&'a str]);
            let cases: [Case; 5] = [
                (&["pop", "gwm"], &[], &[], &[]),
                (&["pop", "gwm", "new"], &[], &[], &[]),
                (&["pop"], &[], &["gwm"], &["gwm"]),
                (&["pop"], &["gwm"], &[], &["gwm"]),
                (&[], &["pop"], &["gwm"], &["pop", "gwm"]),
            ];
            for (listed, dropped, refused, unpublished) in cases {
                let dropped: BTreeSet<ModelId> = ids(dropped).into_iter().collect();
                let got = left_out(contract, &reference, &manifest_of(listed), &dropped);
                let want = match (partial, refused, unpublished) {
                    (false, [], _) | (true, _, []) => LeftOut::None,
                    (false, r, _) => LeftOut::Refused(ids(r)),
                    (true, _, u) => LeftOut::StayUnpublished(ids(u)),
                };
                assert_eq!(got, want, "v{generation} {listed:?} {dropped:?}");
            }
        }
    }
}
