//! Download progress as both binaries draw it on a terminal, through indicatif:
//! `LABEL [=====>    ] DONE/TOTAL RATE eta ETA`, sizes in binary units (`1.50 MiB`).
//! `release-cli` draws [`BYTES_TEMPLATE`]; `device-modeld-manager` draws
//! [`WIDE_BYTES_TEMPLATE`], whose bar takes what the terminal's width leaves, so a 16-character
//! model id still fits 80 columns and indicatif redraws the one line in place.
//!
//! Every human size either binary prints is [`bytes`], in the format of indicatif's `HumanBytes`
//! (the bar's `{bytes}`), so the bar and the text beside it read alike; it is written here
//! rather than called so the format crates that take this crate do not build indicatif. Log
//! lines are stamped with [`crate::time::timestamp`].

use std::io::IsTerminal;
use std::time::Duration;

/// The template of a byte-count bar, in indicatif's syntax (`release-cli`).
pub const BYTES_TEMPLATE: &str = "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";

/// [`BYTES_TEMPLATE`] with a bar as wide as the terminal leaves room for (the device binary).
pub const WIDE_BYTES_TEMPLATE: &str =
    "{msg} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";

/// The bar's filled, head and empty characters (indicatif's `progress_chars`).
pub const BAR_CHARS: &str = "=> ";

/// Whether progress bars would only be noise: `--json`, `-q`, or stderr is not a terminal.
pub fn bars_hidden(json: bool) -> bool {
    json || crate::verbosity() == crate::Verbosity::Quiet || !std::io::stderr().is_terminal()
}

/// A byte count in binary units, two decimals: `512 B`, `1.00 KiB`, `45.00 MiB` (what
/// indicatif's `HumanBytes`, the bar's own `{bytes}`, prints). `--json` keeps exact bytes.
pub fn bytes(n: u64) -> String {
    let (mut value, mut unit) = (n as f64, "B");
    for next in ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"] {
        if value < 1024.0 {
            break;
        }
        (value, unit) = (value / 1024.0, next);
    }
    match unit {
        "B" => format!("{n} B"),
        _ => format!("{value:.2} {unit}"),
    }
}

/// A transfer's rate, `1.50 MiB/s`: `n` bytes over `took` (`0 B/s` for no time).
pub fn rate(n: u64, took: Duration) -> String {
    let secs = took.as_secs_f64();
    let per_sec = if secs > 0.0 { n as f64 / secs } else { 0.0 };
    format!("{}/s", bytes(per_sec as u64))
}

/// A duration as a person reads it in a log: `0.4 s`, `12.0 s`, `3 min 05 s`, `1 h 02 min`.
pub fn took(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1} s", d.as_secs_f64()),
        60..3600 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_rates_and_durations() {
        for (n, text) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.00 KiB"),
            (1536, "1.50 KiB"),
            (47_185_920, "45.00 MiB"),
            (69_654_736_896, "64.87 GiB"),
        ] {
            assert_eq!(bytes(n), text, "{n}");
        }
        // The bar's `{bytes}` and the text beside it are one format, at every unit's edges.
        for k in 0..64 {
            for n in [
                1u64 << k,
                (1 << k) - 1,
                (1 << k) + (1 << k) / 3,
                u64::MAX >> k,
            ] {
                assert_eq!(bytes(n), indicatif::HumanBytes(n).to_string(), "{n}");
            }
        }
        assert_eq!(rate(3 << 20, Duration::from_secs(2)), "1.50 MiB/s");
        assert_eq!(rate(5, Duration::ZERO), "0 B/s");
        for (secs, text) in [
            (0.4, "0.4 s"),
            (12.04, "12.0 s"),
            (185.0, "3 min 05 s"),
            (3720.0, "1 h 02 min"),
        ] {
            assert_eq!(took(Duration::from_secs_f64(secs)), text, "{secs}");
        }
    }

    /// The device's template draws with indicatif (a template error would panic at runtime).
    #[test]
    fn templates_parse() {
        for t in [BYTES_TEMPLATE, WIDE_BYTES_TEMPLATE] {
            indicatif::ProgressStyle::with_template(t).unwrap();
        }
    }
}
