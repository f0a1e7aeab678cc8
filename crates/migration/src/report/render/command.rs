//! `refresh`, `download` and `gc` as they print: the summary on stdout, what is left to do on
//! stderr (`--json` is the report itself).

use super::{Line, Render, out_then_notes};
use crate::rules::contract::is_builtin_id;
use crate::run::downloads::DownloadReport;
use crate::run::manager::{GcReport, RefreshReport};

impl Render for RefreshReport {
    fn text(&self) -> Vec<Line> {
        let r = self;
        let line = format!(
            "{} manifest from {}: {} models; selected {}{}{}",
            r.generation,
            r.manifest_origin,
            r.models,
            r.selected,
            r.migrated_from
                .as_ref()
                .map(|f| format!("; migrated from {f}, purged {} files", r.purged.len()))
                .unwrap_or_default(),
            if r.fell_back_to_builtin {
                " (fell back to the built-in model)"
            } else {
                ""
            }
        );
        let mut notes = Vec::new();
        if !r.retrying.is_empty() {
            notes.push(format!(
                "retrying later: {} (the built-in, or the verified older copy, stands in until \
                 it downloads)",
                r.retrying.join(", ")
            ));
        }
        if !r.dropped.is_empty() {
            notes.push(format!(
                "dropped for good (not in the {} catalog): {}",
                r.generation,
                r.dropped.join(", ")
            ));
        }
        notes.push(if !r.retrying.is_empty() && r.dropped.is_empty() {
            "next: nothing to do; `refresh` tries it again at once, and the daemon retries it on \
             its own after a backoff (`status` shows when)"
                .to_string()
        } else if r.fell_back_to_builtin {
            format!(
                "next: the selected model is not available for {}; pick another one, then \
                 `download <ID>` it",
                r.generation
            )
        } else {
            "next: `resolve` prints the path modeld loads; `status` shows the rest".to_string()
        });
        out_then_notes([line], notes)
    }
}

/// `download <ID>` or `download --all`: the path, or that all were downloaded.
impl Render for DownloadReport {
    fn text(&self) -> Vec<Line> {
        let mut lines = Vec::new();
        if self.all {
            lines.push(Line::Out("All models downloaded!".to_string()));
        } else if let Some(m) = self.models.first() {
            lines.push(Line::Out(m.path.display().to_string()));
            if !m.downloaded && !is_builtin_id(m.id.as_str()) && !m.id.is_local() {
                lines.push(Line::Note(format!(
                    "{}: a verified copy is installed; nothing was downloaded",
                    m.id
                )));
            }
        }
        lines.push(Line::Note(
            "next: select a model in the UI (param `Model`); `resolve` prints what modeld loads"
                .to_string(),
        ));
        lines
    }
}

/// `gc`: a `removed` line per file.
impl Render for GcReport {
    fn text(&self) -> Vec<Line> {
        let lines = self.removed.iter().map(|r| format!("removed {r}"));
        let none = self.removed.is_empty();
        out_then_notes(lines, none.then(|| "nothing to remove".to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::downloads::Downloaded;
    use manifest::Generation;

    fn outs(lines: &[Line]) -> Vec<&str> {
        lines
            .iter()
            .filter_map(|l| match l {
                Line::Out(s) => Some(s.as_str()),
                _ => None,
            })
            .collect()
    }

    fn notes(lines: &[Line]) -> Vec<&str> {
        lines
            .iter()
            .filter_map(|l| match l {
                Line::Note(s) => Some(s.as_str()),
                _ => None,
            })
            .collect()
    }

    fn report(g: u32) -> RefreshReport {
        RefreshReport {
            generation: Generation::new(g),
            manifest_origin: "hf".into(),
            models: 3,
            migrated_from: None,
            purged: Vec::new(),
            selected: "pop223".parse().unwrap(),
            fell_back_to_builtin: false,
            retrying: Vec::new(),
            dropped: Vec::new(),
            needs_chestnut: Vec::new(),
            held_back: Vec::new(),
            refused_entries: Vec::new(),
            went_through: Default::default(),
        }
    }

    /// The summary line, and the next step each outcome gets, for v25 and a made-up v26.
    #[test]
    fn a_refresh_says_what_it_did_and_what_is_next() {
        type Edit = fn(&mut RefreshReport);
        let table: [(Edit, &str, &str); 5] = [
            (|_| {}, "", "next: `resolve` prints"),
            (
                |r| {
                    r.migrated_from = Some("v24".into());
                    r.purged = vec!["a".into(), "b".into()];
                },
                "; migrated from v24, purged 2 files",
                "next: `resolve` prints",
            ),
            (
                |r| r.retrying = vec!["pop223".into()],
                "",
                "next: nothing to do; `refresh` tries it again at once",
            ),
            (
                |r| {
                    r.fell_back_to_builtin = true;
                    r.retrying = vec!["pop223".into()];
                    r.dropped = vec!["gone1".into()];
                },
                " (fell back to the built-in model)",
                "next: the selected model is not available for v",
            ),
            (
                |r| r.fell_back_to_builtin = true,
                " (fell back to the built-in model)",
                "next: the selected model is not available for v",
            ),
        ];
        for g in [25, 26] {
            for (edit, tail, next) in &table {
                let mut r = report(g);
                edit(&mut r);
                let text = r.text();
                assert_eq!(
                    outs(&text),
                    [format!(
                        "v{g} manifest from hf: 3 models; selected pop223{tail}"
                    )]
                );
                let n = notes(&text);
                assert!(n.last().unwrap().starts_with(next), "v{g}: {n:?}");
                assert_eq!(
                    n.iter().any(|l| l.starts_with("retrying later: pop223")),
                    !r.retrying.is_empty()
                );
                assert_eq!(
                    n.iter().any(|l| *l
                        == format!("dropped for good (not in the v{g} catalog): gone1")),
                    !r.dropped.is_empty()
                );
            }
        }
    }

    fn downloaded(id: &str, downloaded: bool) -> Downloaded {
        Downloaded {
            id: id.parse().unwrap(),
            path: format!("/data/models/{id}_driving_tinygrad.pkl").into(),
            downloaded,
        }
    }

    #[test]
    fn a_download_prints_the_path_and_says_when_nothing_was_fetched() {
        let doc = |all, models| DownloadReport { all, models };
        let next =
            "next: select a model in the UI (param `Model`); `resolve` prints what modeld loads";
        let fetched = doc(false, vec![downloaded("pop223", true)]);
        assert_eq!(
            fetched.text(),
            [
                Line::Out("/data/models/pop223_driving_tinygrad.pkl".into()),
                Line::Note(next.into())
            ]
        );
        let kept = doc(false, vec![downloaded("pop223", false)]).text();
        assert_eq!(
            notes(&kept)[0],
            "pop223: a verified copy is installed; nothing was downloaded"
        );
        // The built-in (under either name) and a local model are never downloaded: no note.
        for id in ["rdf43", "rdf", "local-mine"] {
            assert_eq!(
                notes(&doc(false, vec![downloaded(id, false)]).text()),
                [next]
            );
        }
        let all = doc(
            true,
            vec![downloaded("pop223", true), downloaded("sc23", false)],
        );
        assert_eq!(outs(&all.text()), ["All models downloaded!"]);
        // `--json` is the report alone.
        assert_eq!(
            serde_json::to_string(&all).unwrap(),
            r#"{"models":[{"id":"pop223","path":"/data/models/pop223_driving_tinygrad.pkl","downloaded":true},{"id":"sc23","path":"/data/models/sc23_driving_tinygrad.pkl","downloaded":false}]}"#
        );
    }

    #[test]
    fn gc_lists_what_it_removed() {
        let gc = |removed: &[&str]| GcReport {
            removed: removed.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(gc(&[]).text(), [Line::Note("nothing to remove".into())]);
        assert_eq!(
            gc(&["a.tmp", "old_driving_tinygrad.pkl"]).text(),
            [
                Line::Out("removed a.tmp".into()),
                Line::Out("removed old_driving_tinygrad.pkl".into())
            ]
        );
        assert_eq!(
            serde_json::to_string(&gc(&["a.tmp"])).unwrap(),
            r#"{"removed":["a.tmp"]}"#
        );
    }
}
